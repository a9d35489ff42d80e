package delivery

import (
	"testing"

	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/wal"
)

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
		key, keyed := MessageKey([]byte(tc.content), "aggregate_id")
		if string(key) != tc.key || keyed != tc.keyed {
			t.Errorf("MessageKey(%s) = %q, %v; want %q, %v", tc.content, key, keyed, tc.key, tc.keyed)
		}
	}
	// The shard of a keyed message is its key's, as for a row.
	key, _ := MessageKey([]byte(`{"aggregate_id": "order-1"}`), "aggregate_id")
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
		tp.shard = shard.Shard{Index: i, Count: 2}
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
