package sink

import (
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/config"
)

// NewWithFirstOpts is New with franz-go options placed ahead of outboxd's.
func NewWithFirstOpts(cfg config.Kafka, m *Metrics, log *slog.Logger, first ...kgo.Opt) (*Producer, error) {
	return newProducer(cfg, m, log, first...)
}

// RetryBackoff is retryBackoff, for the producer's external tests.
var RetryBackoff = retryBackoff
