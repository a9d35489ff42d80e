package sink_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/sink"
)

// TestCreateTopicWithTooFewBrokersSaysSo checks that a topic that cannot
// be created because fewer brokers are up than its replication factor (one
// broker of three restarting) is reported as that, not as a permissions
// problem: outboxd meets it in every rolling restart that coincides with a
// new topic, and restarts its pipeline until the broker is back.
func TestCreateTopicWithTooFewBrokersSaysSo(t *testing.T) {
	c := newCluster(t, 2)
	cfg := config.Default().Kafka
	cfg.Brokers = c.ListenAddrs()
	cfg.TopicPartitions, cfg.TopicReplicationFactor = 1, 3
	p, err := sink.New(cfg, sink.NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = p.EnsureTopic(ctx, "new-events")
	if !errors.Is(err, kerr.InvalidReplicationFactor) {
		t.Fatalf("creating a topic with replication factor 3 on two brokers: %v, want INVALID_REPLICATION_FACTOR", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "fewer brokers are up than kafka.topic_replication_factor") || strings.Contains(msg, "permissions") {
		t.Errorf("the error does not say that brokers are missing: %s", msg)
	}
}
