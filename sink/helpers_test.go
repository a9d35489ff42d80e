package sink_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/kfaketest"
	"github.com/outboxd/outboxd/sink"
)

// The producer's tests run a real sink.Producer against franz-go's
// in-process kfake, whose ControlKey injects broker errors. The fault suite
// that runs the relay's pipeline on it is the relay's (relay/kfake_test.go).

// topic is the topic the tests produce to.
const topic = "orders-events"

// newCluster returns a kfake cluster of brokers brokers, closed at cleanup.
func newCluster(t *testing.T, brokers int) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// newProducer returns a Producer on c's brokers with one-partition topics,
// its caps set by tune (if not nil), closed at cleanup, with topic created,
// and a context that ends the test after 30 s.
func newProducer(t *testing.T, c *kfake.Cluster, tune func(*config.Kafka)) (*sink.Producer, context.Context) {
	t.Helper()
	cfg := config.Default().Kafka
	cfg.Brokers = c.ListenAddrs()
	cfg.TopicPartitions = 1
	cfg.TopicReplicationFactor = 1
	if tune != nil {
		tune(&cfg)
	}
	p, err := sink.New(cfg, sink.NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if err := p.EnsureTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}
	return p, ctx
}

// holdProduce makes c hold every produce request until release is called.
func holdProduce(c *kfake.Cluster) (release func()) { return kfaketest.HoldProduce(c) }

// rejectingProducer returns a producer (as newProducer) whose broker
// rejects every produce request with INVALID_RECORD.
func rejectingProducer(t *testing.T) (*sink.Producer, context.Context) {
	t.Helper()
	c := newCluster(t, 1)
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return kfaketest.ProduceResponse(req, kerr.InvalidRecord.Code), nil, true
	})
	return newProducer(t, c, nil)
}
