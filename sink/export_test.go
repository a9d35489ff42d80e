package sink

import (
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/config"
)

// NewWithFirstOpts is New with franz-go options placed ahead of outboxd's.
func NewWithFirstOpts(cfg config.Kafka, m *Metrics, log *slog.Logger, first ...kgo.Opt) (*Producer, error) {
	return newProducer(cfg, m, log, first...)
}

// RetryBackoff is retryBackoff, for the producer's external tests.
var RetryBackoff = retryBackoff

// NoteRefusal and RefusedSince are the producer's refusal record, for its
// external tests.
func (p *Producer) NoteRefusal(err error)          { p.noteRefusal(err) }
func (p *Producer) RefusedSince(t time.Time) error { return p.refusedSince(t) }
func LookupRefusal(err error) error                { return &lookupRefusal{err} }
