package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/outbox"
)

// Two deployments on one database, each with its outbox table, slot and
// publication (issue 32 item 12): each delivers only the logical messages
// that package outbox wrote for its table, and the messages that name no
// table go to the one deployment with router.messages.unowned: deliver (A)
// and not to the one with ignore (B).
func TestMessageOwners(t *testing.T) {
	d := newDB(t)
	ctx := context.Background()
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.Apply(ctx, conn.Conn(), "public", "orders_outbox"); err != nil {
		t.Fatal(err)
	}
	conn.Release()
	d.exec(t, `CREATE TABLE public.unstreamed (id int)`) // a table no publication lists
	slotB := d.slot + "_b"
	t.Cleanup(func() { // before newDB's cleanup, after the processes are killed
		for range 50 {
			_, _ = d.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active`, slotB)
			if _, err := d.pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slotB); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	agg := d.name + "_own"
	a := start(t, d.env("OUTBOXD_ROUTER_TOPIC_TEMPLATE=a-${routedByValue}"))
	envB := replace(d.env("OUTBOXD_ROUTER_TOPIC_TEMPLATE=b-${routedByValue}", "OUTBOXD_ROUTER_MESSAGES_UNOWNED=ignore",
		"OUTBOXD_POSTGRES_TABLE=public.orders_outbox", "OUTBOXD_POSTGRES_PUBLICATION=outboxd_b"), "OUTBOXD_POSTGRES_SLOT", slotB)
	b := start(t, envB)
	a.waitStreaming()
	b.waitStreaming()

	writerA, err := outbox.New(outbox.Config{Mode: outbox.Message}) // public.outbox
	if err != nil {
		t.Fatal(err)
	}
	writerB, err := outbox.New(outbox.Config{Table: "public.orders_outbox", Mode: outbox.Message})
	if err != nil {
		t.Fatal(err)
	}
	event := outbox.Event{AggregateType: agg, AggregateID: "k", Type: "Sent", Payload: []byte(`{}`)}
	var ofA, ofB, unowned []string
	write := func(tx pgx.Tx, w *outbox.Writer, into *[]string) {
		ids, err := w.Write(ctx, tx, event, event)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			*into = append(*into, id.String())
		}
	}
	// A message that names no table, or one that no other publication lists
	// (a writer's Config.Table that is no deployment's), is unowned.
	emitUnowned := func(tx pgx.Tx, owner string) {
		id := uuid()
		content := fmt.Sprintf(`{"id": "%s", "aggregate_type": "%s", "aggregate_id": "k", "event_type": "Sent", "payload": {}%s}`, id, agg, owner)
		if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outbox', $1)`, content); err != nil {
			t.Fatal(err)
		}
		unowned = append(unowned, id)
	}
	// One transaction with the messages of both and unowned ones, then one
	// with B's only and one with unowned ones only.
	for _, txn := range []func(pgx.Tx){
		func(tx pgx.Tx) { write(tx, writerA, &ofA); write(tx, writerB, &ofB); emitUnowned(tx, "") },
		func(tx pgx.Tx) { write(tx, writerB, &ofB) },
		func(tx pgx.Tx) {
			emitUnowned(tx, "")
			emitUnowned(tx, `, "__outbox_table": "public.no_such_outbox"`)
			emitUnowned(tx, `, "__outbox_table": "public.unstreamed"`)
		},
	} {
		if err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error { txn(tx); return nil }); err != nil {
			t.Fatal(err)
		}
	}

	topicA, topicB := "a-"+agg, "b-"+agg
	want := map[string]string{} // event id → the one topic it must reach
	for _, id := range append(append([]string{}, ofA...), unowned...) {
		want[id] = topicA
	}
	for _, id := range ofB {
		want[id] = topicB
	}
	all := make([]string, 0, len(want))
	for id := range want {
		all = append(all, id)
	}
	recs := readUntil(t, []string{topicA, topicB}, time.Minute, 2*time.Second, waitIDs(all...))
	got := map[string][]string{} // event id → the topics it reached
	for _, r := range recs {
		got[header(r, "id")] = append(got[header(r, "id")], r.Topic)
	}
	for id, topic := range want {
		if g := got[id]; len(g) != 1 || g[0] != topic {
			t.Errorf("event %s reached %v, want %s once", id, g, topic)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d events delivered, want %d", len(got), len(want))
	}
	t.Logf("A delivered %d of its own and %d unowned, B %d of its own", len(ofA), len(unowned), len(ofB))
	b.waitLog(`msg="leaving the logical messages of outbox table public.outbox to the outboxd that streams it`, 10*time.Second)
	a.waitLog(`msg="a logical message names outbox table public.unstreamed, which no other publication lists`, 10*time.Second)
}
