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
	"github.com/outboxd/outboxd/internal/delivery"
	"github.com/outboxd/outboxd/internal/kfaketest"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
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

// A logical message's key is its key field as the router reads it: a
// string's text, another JSON value's own text; none when missing or null.
func TestMessageKey(t *testing.T) {
	for _, tc := range []struct {
		content, key string
		keyed        bool
	}{
		{`{"aggregate_id": "order-1"}`, "order-1", true},
		{`{"aggregate_id": "\u00e9t\u00e9"}`, "été", true},
		{`{"aggregate_id": 42}`, "42", true},
		{`{"aggregate_id": {"a": 1}}`, `{"a": 1}`, true},
		{`{"aggregate_id": null}`, "", false},
		{`{"other": "x"}`, "", false},
		{`not json`, "", false},
	} {
		key, keyed := delivery.MessageKey([]byte(tc.content), "aggregate_id")
		if string(key) != tc.key || keyed != tc.keyed {
			t.Errorf("delivery.MessageKey(%s) = %q, %v; want %q, %v", tc.content, key, keyed, tc.key, tc.keyed)
		}
	}
	// The shard of a keyed message is its key's, as for a row.
	key, _ := delivery.MessageKey([]byte(`{"aggregate_id": "order-1"}`), "aggregate_id")
	if shard.MessageOwner(key, true, 4) != shard.Of([]byte("order-1"), 4) {
		t.Error("a keyed message's shard differs from its key's")
	}
}

// An old shard during a reshard (its window with Upto X): transactions
// ending at or before X are delivered; the first whose commit starts at or
// after X is not, stops the stream and makes the pipeline handle nothing
// more; the position confirmed never passes X.
func TestPipelineStopsAtTheWindowsEnd(t *testing.T) {
	tp := newTestPipeline(t, nil)
	const x = 0x400
	tp.window = shard.Window{Upto: x}
	stopped := 0
	tp.stopReading = func() { stopped++ }
	tp.handle(t, begin(0x300), change(wal.Insert, 0x2f0, id1, "o-1", `{}`), commit(0x310))
	tp.handle(t, begin(x), change(wal.Insert, 0x3f0, id2, "o-2", `{}`), commit(x+0x10),
		begin(0x500), change(wal.Insert, 0x4f0, id2, "o-3", `{}`), commit(0x510), wal.Keepalive{WALEnd: 0x600})
	if n := len(tp.prod.recs); n != 1 || header(tp.prod.recs[0], "id") != id1 {
		t.Fatalf("%d records handed over, want only the one of the transaction before the cutover", n)
	}
	if stopped != 1 || !tp.pastWindow {
		t.Errorf("stopReading called %d times, past the window %v; want once and past", stopped, tp.pastWindow)
	}
	tp.prod.ackAll(nil)
	if got := tp.tracker.Confirmed(); got != 0x310 {
		t.Errorf("confirmed %s, want 0/310, the end of the delivered transaction", got)
	}
	tp.tracker.Idle(x) // what the drain stage does once all is acknowledged
	if got := tp.window.Confirm(tp.tracker.Confirmed()); got != x {
		t.Errorf("confirmed %s after the drain, want the cutover", got)
	}

	// Idle: a keepalive reaching the cutover ends the window too, and the
	// position sent is capped at it.
	idle := newTestPipeline(t, nil)
	idle.window = shard.Window{Upto: x}
	idle.stopReading = func() { stopped++ }
	idle.handle(t, wal.Keepalive{WALEnd: 0x380})
	if idle.pastWindow {
		t.Error("past the window before the WAL reached the cutover")
	}
	idle.handle(t, wal.Keepalive{WALEnd: 0x480})
	if !idle.pastWindow || idle.window.Confirm(idle.tracker.Confirmed()) != x {
		t.Errorf("after a keepalive past the cutover: past the window %v, confirm %s", idle.pastWindow, idle.window.Confirm(idle.tracker.Confirmed()))
	}
}

// With shards, a logical message is delivered only by its key's shard.
func TestPipelineDeliversOnlyItsShardsMessages(t *testing.T) {
	var delivered int
	for i := range 2 {
		tp := newTestPipeline(t, nil)
		tp.r.shard = shard.Shard{Index: i, Count: 2}
		tp.handle(t, begin(0x300))
		for k := range 8 {
			tp.handle(t, &wal.Message{XID: 7, LSN: 0x200, Transactional: true, Prefix: "outbox",
				Content: []byte(`{"id": "m", "aggregate_type": "order", "aggregate_id": "k-` + string(rune('a'+k)) + `", "event_type": "Sent", "payload": {}}`)})
		}
		tp.handle(t, commit(0x310))
		for _, rec := range tp.prod.recs {
			if shard.Of(rec.Key, 2) != i {
				t.Errorf("shard %d delivered key %q of shard %d", i, rec.Key, shard.Of(rec.Key, 2))
			}
		}
		delivered += len(tp.prod.recs)
	}
	if delivered != 8 {
		t.Errorf("the two shards delivered %d messages, want each of the 8 once", delivered)
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

// Issue 32 item 6: a new shard after a reshard (its window with After X)
// delivers nothing of a transaction ending at or before X, which the old
// shards delivered, but confirms it in order, and delivers what ends after.
func TestPipelineSkipsUpToTheWindowsStart(t *testing.T) {
	tp := newTestPipeline(t, nil)
	const x = 0x400
	tp.window = shard.Window{After: x}
	tp.handle(t, begin(0x300), change(wal.Insert, 0x2f0, id1, "o-1", `{}`), commit(0x310),
		begin(x-0x10), change(wal.Insert, 0x3e0, id1, "o-2", `{}`), commit(x),
		begin(x), change(wal.Insert, 0x3f0, id2, "o-3", `{}`), commit(x+0x10))
	if n := len(tp.prod.recs); n != 1 || header(tp.prod.recs[0], "id") != id2 {
		t.Fatalf("%d records handed over, want only the one of the transaction ending after the cutover", n)
	}
	tp.prod.ackAll(nil)
	if got := tp.tracker.Confirmed(); got != x+0x10 {
		t.Errorf("confirmed %s, want %s", got, wal.LSN(x+0x10))
	}
}
