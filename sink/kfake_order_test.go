package sink_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Faults that fail records: the run ends and the next one starts from the
// confirmed position. Nothing may be confirmed past a failed record. First
// deliveries of a key follow commit order when the failure is a timeout (the
// whole client is torn down); for records Kafka rejects, see reorderAllowed.
func TestProducerFailureKeepsKeyOrder(t *testing.T) {
	runFaultCases(t, []faultCase{
		{name: "non-retriable errors", brokers: 1, deliveryTimeout: time.Minute, wantFailedRuns: true, reorderAllowed: true,
			inject: func(t *testing.T, c *kfake.Cluster) (func(), func() int64) {
				codes := []int16{kerr.InvalidRecord.Code, kerr.CorruptMessage.Code, kerr.MessageTooLarge.Code}
				var i atomic.Int64
				n := everyNth(c, 7, 6, func(req kmsg.Request) (kmsg.Response, error) {
					return produceResp(req, codes[i.Add(1)%int64(len(codes))]), nil
				})
				return func() {}, n.Load
			}},
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
