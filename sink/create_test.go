package sink_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
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

// TestCreateTopicWithBrokersUnreachableSaysSo checks that the topic lookup
// and creation end within kafka.delivery_timeout when no broker answers
// (refused, or a listener that accepts and never replies), and that the
// error says the brokers did not answer rather than blaming permissions.
func TestCreateTopicWithBrokersUnreachableSaysSo(t *testing.T) {
	refused := newCluster(t, 1)
	refusedAddrs := refused.ListenAddrs()
	refused.Close() // nothing listens there any more
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	for _, c := range []struct {
		name    string
		brokers []string
	}{{"refused", refusedAddrs}, {"silent", []string{silent.Addr().String()}}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config.Default().Kafka
			cfg.Brokers = c.brokers
			cfg.DeliveryTimeout = 2 * time.Second
			p, err := sink.New(cfg, sink.NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			err = p.EnsureTopic(ctx, "new-events")
			took := time.Since(start)
			if err == nil {
				t.Fatal("creating a topic with no broker answering: no error")
			}
			if msg := err.Error(); !strings.Contains(msg, "did not answer within kafka.delivery_timeout") || strings.Contains(msg, "permissions") {
				t.Errorf("the error does not say that the brokers did not answer: %s", msg)
			}
			// franz-go does not cut a connection's set-up (10 s) short, so
			// the bound is the delivery timeout or that, whichever is longer.
			if took > 20*time.Second {
				t.Errorf("EnsureTopic took %s with kafka.delivery_timeout 2s", took)
			}
			t.Logf("EnsureTopic gave up after %s: %v", took.Round(time.Millisecond), err)
		})
	}
}

// TestRetryBackoff checks the produce retry backoff: tens of milliseconds at
// first (a new topic's partitions refuse the first produce for about that
// long), doubling to franz-go's 5 s.
func TestRetryBackoff(t *testing.T) {
	for fails, want := range map[int][2]time.Duration{1: {20 * time.Millisecond, 30 * time.Millisecond},
		2: {40 * time.Millisecond, 60 * time.Millisecond}, 5: {320 * time.Millisecond, 480 * time.Millisecond}, 20: {5 * time.Second, 5 * time.Second}} {
		for range 20 {
			if got := sink.RetryBackoff(fails); got < want[0] || got > want[1] {
				t.Fatalf("backoff after %d failures: %s, want %s to %s", fails, got, want[0], want[1])
			}
		}
	}
}
