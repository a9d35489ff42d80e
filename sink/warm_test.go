package sink_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// counter counts the requests of one kind that c receives, without
// answering them itself.
func counter(c *kfake.Cluster, key kmsg.Key) *atomic.Int64 {
	var n atomic.Int64
	c.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		n.Add(1)
		return nil, nil, false
	})
	return &n
}

// TestWarmReadiesTheFirstRecord checks that Warm does before the first
// record what would otherwise delay it: it loads the producer id, and it
// learns the topics that exist, so that the first records to them send no
// CreateTopics (one round trip to the controller per topic). A topic that
// does not exist is still created on its first record.
func TestWarmReadiesTheFirstRecord(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "a-events", "b-events"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	creates, inits := counter(c, kmsg.CreateTopics), counter(c, kmsg.InitProducerID)

	cfg := config.Default().Kafka
	cfg.Brokers = c.ListenAddrs()
	cfg.TopicPartitions, cfg.TopicReplicationFactor = 1, 1
	p, err := sink.New(cfg, sink.NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)

	if err := p.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if n := inits.Load(); n != 1 {
		t.Errorf("Warm sent %d InitProducerID requests, want 1 (the producer id loaded before the first record)", n)
	}
	produce := func(topic string, partition int32) {
		t.Helper()
		acked := make(chan error, 1)
		rec := &router.Record{Topic: topic, Key: []byte("k"), Value: []byte("v"), EventID: "e", Partition: partition}
		if err := p.Produce(ctx, rec, func(err error) { acked <- err }); err != nil {
			t.Fatal(err)
		}
		if err := <-acked; err != nil {
			t.Fatal(err)
		}
	}
	produce("a-events", -1)
	produce("b-events", 2) // an explicit partition: its count is known from Warm too
	if n := creates.Load(); n != 0 {
		t.Errorf("the first records to existing topics sent %d CreateTopics requests after Warm, want 0", n)
	}
	produce("c-events", -1)
	if n := creates.Load(); n != 1 {
		t.Errorf("the first record to a missing topic sent %d CreateTopics requests, want 1", n)
	}
	if n := inits.Load(); n != 1 {
		t.Errorf("%d InitProducerID requests after producing, want the 1 of Warm", n)
	}
}

// TestWatchStartsItsClockWhenCalled checks that a producer made (and
// warmed) long before its pipeline starts is not reported as stalled as
// soon as its first records are in flight.
func TestWatchStartsItsClockWhenCalled(t *testing.T) {
	c := newCluster(t, 1)
	var hold atomic.Bool
	hold.Store(true)
	t.Cleanup(func() { hold.Store(false) })
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		c.SleepControl(func() {
			for hold.Load() {
				time.Sleep(5 * time.Millisecond)
			}
		})
		return nil, nil, false
	})
	const timeout = 400 * time.Millisecond
	p, ctx := newProducer(t, c, func(cfg *config.Kafka) { cfg.DeliveryTimeout = timeout })
	time.Sleep(2 * timeout) // the producer waits, idle, longer than the timeout

	acked := make(chan error, 1)
	rec := &router.Record{Topic: topic, Key: []byte("k"), Value: []byte("v"), EventID: "e", Partition: -1}
	if err := p.Produce(ctx, rec, func(err error) { acked <- err }); err != nil {
		t.Fatal(err)
	}
	watch, stop := context.WithTimeout(ctx, timeout/2)
	defer stop()
	var stall *sink.StallError
	if err := p.Watch(watch); errors.As(err, &stall) {
		t.Fatalf("Watch reported a stall %s after it started, with its record in flight for less than kafka.delivery_timeout (%s): %v",
			timeout/2, timeout, err)
	}
	hold.Store(false)
	if err := <-acked; err != nil {
		t.Fatal(err)
	}
}
