package sink

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// RetryBackoff is retryBackoff, for the producer's external tests.
var RetryBackoff = retryBackoff

// NoteRefusal and RefusedSince are the producer's refusal record, for its
// external tests.
func (p *Producer) NoteRefusal(err error)          { p.noteRefusal(err) }
func (p *Producer) RefusedSince(t time.Time) error { return p.refusedSince(t) }
func LookupRefusal(err error) error                { return &lookupRefusal{err} }

// ConcurrentTxnBackoff is the CONCURRENT_TRANSACTIONS retry interval p's
// client was built with.
func (p *Producer) ConcurrentTxnBackoff() time.Duration {
	return p.client.OptValue(kgo.ConcurrentTransactionsBackoff).(time.Duration)
}
