package relay

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/kfaketest"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// With shards each relay's metrics carry its slot, /status summarises the
// shards and lists each, and /readyz wants every shard streaming; with one
// shard the status is the relay's own, without shards.
func TestShardsStatusAndMetrics(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := config.Default()
	cfg.Postgres.Shards = 2
	reg := prometheus.NewRegistry()
	s, err := NewShards(cfg, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range s.streams {
		r.setState(StateStreaming, "")
	}
	ok, st := s.Ready()
	if !ok || st.State != StateStreaming || len(st.Shards) != 2 || st.Shards[0].Slot != "outboxd_0of2" || st.Shards[1].Slot != "outboxd_1of2" {
		t.Errorf("both shards streaming: ready %v, status %+v", ok, st)
	}
	s.streams[1].setState(StateStandby, "another process holds the slot")
	if ok, st := s.Ready(); ok || st.State != StateStandby || !strings.HasPrefix(st.Reason, "outboxd_1of2: ") {
		t.Errorf("one shard standing by: ready %v, state %s, reason %q", ok, st.State, st.Reason)
	}
	s.setNote("resharding from 1 to 2 shards: creating")
	if ok, st := s.Ready(); ok || st.State != StateStarting || st.Reason != "resharding from 1 to 2 shards: creating" {
		t.Errorf("while resharding: ready %v, state %s, reason %q", ok, st.State, st.Reason)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	slots := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "outboxd_relay_state" && mf.GetName() != "outboxd_slot_lag_bytes" {
			continue
		}
		for _, m := range mf.GetMetric() {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == "slot" {
					slots[mf.GetName()+" "+l.GetValue()], found = true, true
				}
			}
			if !found {
				t.Errorf("%s without a slot label", mf.GetName())
			}
		}
	}
	for _, want := range []string{"outboxd_relay_state outboxd_0of2", "outboxd_relay_state outboxd_1of2", "outboxd_slot_lag_bytes outboxd_0of2", "outboxd_slot_lag_bytes outboxd_1of2"} {
		if !slots[want] {
			t.Errorf("no %s series; have %v", want, slots)
		}
	}

	one, err := NewShards(config.Default(), log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	one.streams[0].setState(StateStreaming, "")
	if ok, st := one.Ready(); !ok || st.Shards != nil || st.Slot != "outboxd" {
		t.Errorf("one shard: ready %v, status %+v", ok, st)
	}
}

// Issue 32 item 7: an old shard past its reshard window ends its run
// cleanly, which ends the stream stage's watchdog; waiting for Kafka's
// acknowledgements after that must still end, after kafka.delivery_timeout,
// with the stall, when the broker never answers.
func TestAwaitAcksReportsAStall(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg := config.Default().Kafka
	cfg.Brokers = c.ListenAddrs()
	cfg.TopicPartitions, cfg.TopicReplicationFactor = 1, 1
	cfg.DeliveryTimeout = time.Second
	p, err := sink.New(cfg, sink.NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.EnsureTopic(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	// The broker never answers a produce request.
	t.Cleanup(kfaketest.HoldProduce(c))
	tracker := checkpoint.New(0)
	txn := tracker.Begin()
	txn.Add()
	rec := &router.Record{Topic: "t", Key: []byte("k"), Value: []byte("v"), EventID: "e", Partition: -1}
	if err := p.Produce(ctx, rec, func(err error) {
		if err == nil {
			txn.Ack()
		}
	}); err != nil {
		t.Fatal(err)
	}
	txn.Commit(0x100)
	run, fail := context.WithCancelCause(ctx)
	started := time.Now()
	werr := awaitAcks(run, fail, tracker, p)
	var stall *sink.StallError
	if werr == nil || !errors.As(context.Cause(run), &stall) {
		t.Fatalf("awaitAcks returned %v after %s, cause %v; want the stall after kafka.delivery_timeout (%s)",
			werr, time.Since(started).Round(time.Millisecond), context.Cause(run), cfg.DeliveryTimeout)
	}
	if d := time.Since(started); d < cfg.DeliveryTimeout || d > 5*cfg.DeliveryTimeout {
		t.Errorf("the stall was reported after %s; want about kafka.delivery_timeout (%s)", d, cfg.DeliveryTimeout)
	}
	t.Logf("reported after %s: %v", time.Since(started).Round(time.Millisecond), stall)
}
