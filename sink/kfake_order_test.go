package sink_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Faults that fail records: the run ends and the next one starts from the
// confirmed position. Nothing may be confirmed past a failed record, and
// first deliveries of a key follow commit order.
func TestProducerFailureKeepsKeyOrder(t *testing.T) {
	// rejectEvery rejects every nth produce request, six times.
	rejectEvery := func(nth int) func(t *testing.T, c *kfake.Cluster) (func(), func() int64) {
		return func(t *testing.T, c *kfake.Cluster) (func(), func() int64) {
			codes := []int16{kerr.InvalidRecord.Code, kerr.CorruptMessage.Code, kerr.MessageTooLarge.Code, kerr.TopicAuthorizationFailed.Code}
			var i atomic.Int64
			n := everyNth(c, nth, 6, func(req kmsg.Request) (kmsg.Response, error) {
				return produceResp(req, codes[i.Add(1)%int64(len(codes))]), nil
			})
			return func() {}, n.Load
		}
	}
	runFaultCases(t, []faultCase{
		{name: "non-retriable errors", brokers: 1, deliveryTimeout: time.Minute, wantFailedRuns: true, inject: rejectEvery(7)},
		// franz-go reports a rejection on another goroutine. Delaying that
		// report (with room to hand over every record meanwhile) widens the
		// moment in which a record handed over would be written ahead of the
		// rejected one: the fence must break when the response is read, not
		// when it is reported.
		{name: "non-retriable errors reported late", brokers: 1, deliveryTimeout: time.Minute, wantFailedRuns: true, inject: rejectEvery(2),
			buffered: 5000, pace: 100 * time.Microsecond, first: []kgo.Opt{kgo.WithHooks(&slowFailureReport{d: 20 * time.Millisecond})}},
		{name: "retriable errors past the delivery timeout", brokers: 1, deliveryTimeout: 2 * time.Second, wantFailedRuns: true,
			inject: func(t *testing.T, c *kfake.Cluster) (func(), func() int64) {
				var n, seen atomic.Int64
				start := time.Now()
				c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
					c.KeepControl()
					// Refuse every produce for a window after the 10th request.
					if seen.Add(1) < 10 || time.Since(start) > 6*time.Second {
						return nil, nil, false
					}
					n.Add(1)
					c.SleepControl(func() { time.Sleep(50 * time.Millisecond) })
					return produceResp(req, kerr.NotLeaderForPartition.Code), nil, true
				})
				return func() {}, n.Load
			}},
	})
}

// slowFailureReport delays franz-go's report of the first failed record of
// each run (its hooks and promises run one after another on one goroutine).
type slowFailureReport struct {
	d    time.Duration
	last atomic.Int64 // unix nanos of the last delay
}

func (h *slowFailureReport) OnProduceRecordUnbuffered(_ *kgo.Record, err error) {
	if now := time.Now().UnixNano(); err != nil && now-h.last.Load() > int64(10*h.d) {
		h.last.Store(now)
		time.Sleep(h.d)
	}
}
