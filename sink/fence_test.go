package sink_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// After Kafka rejects a batch for good, Produce refuses every later record,
// and its error carries the rejection (not a bare "context canceled"), so
// the operator reads why from whichever error reaches the log first.
func TestProduceAfterRejectionSaysWhy(t *testing.T) {
	c := newCluster(t, 1)
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return produceResp(req, kerr.InvalidRecord.Code), nil, true
	})
	cfg := config.Default().Kafka
	cfg.Brokers = c.ListenAddrs()
	cfg.TopicPartitions = 1
	cfg.TopicReplicationFactor = 1
	p, err := sink.New(cfg, sink.NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.EnsureTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}
	rec := func(id string) *router.Record {
		return &router.Record{Topic: topic, Key: []byte("k"), Value: []byte("v"), EventID: id, Partition: -1}
	}
	failed := make(chan error, 1)
	if err := p.Produce(ctx, rec("1"), func(err error) { failed <- err }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-failed:
		if !errors.Is(err, kerr.InvalidRecord) {
			t.Fatalf("first record: got %v, want INVALID_RECORD", err)
		}
	case <-ctx.Done():
		t.Fatal("the rejected record was never reported")
	}
	err = p.Produce(ctx, rec("2"), func(error) { t.Error("a record after the rejection was handed over") })
	if !errors.Is(err, kerr.InvalidRecord) {
		t.Errorf("Produce after the rejection: got %v, want an error carrying INVALID_RECORD", err)
	}
}
