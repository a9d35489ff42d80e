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
// that name its table (package outbox writes a Config.Table set explicitly),
// the messages that name none (a writer with no Config.Table, or one by
// hand) go to the one deployment with router.messages.unowned: deliver (A)
// and not to the one with ignore (B), and a message that names a table
// neither streams is delivered by neither, counted and logged. The decision
// reads the message alone, never the catalogue, so that a replay decides as
// the first run did (review findings 1-7).
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

	newWriter := func(table string) *outbox.Writer {
		w, err := outbox.New(outbox.Config{Table: table, Mode: outbox.Message})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	writerA, writerB := newWriter("public.outbox"), newWriter("public.orders_outbox")
	writerNone := newWriter("") // no owner: unowned, as before the field existed
	event := outbox.Event{AggregateType: agg, AggregateID: "k", Type: "Sent", Payload: []byte(`{}`)}
	var ofA, ofB, unowned, nobodys []string
	write := func(tx pgx.Tx, w *outbox.Writer, into *[]string) {
		ids, err := w.Write(ctx, tx, event, event)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			*into = append(*into, id.String())
		}
	}
	emit := func(tx pgx.Tx, owner string, into *[]string) {
		id := uuid()
		content := fmt.Sprintf(`{"id": "%s", "aggregate_type": "%s", "aggregate_id": "k", "event_type": "Sent", "payload": {}%s}`, id, agg, owner)
		if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outbox', $1)`, content); err != nil {
			t.Fatal(err)
		}
		*into = append(*into, id)
	}
	// One transaction with the messages of both and unowned ones, then one
	// with B's only, then one with messages that name a table neither
	// streams, followed by one of each deployment's: all on one key, so
	// once those arrive, the others would have arrived before them.
	for _, txn := range []func(pgx.Tx){
		func(tx pgx.Tx) {
			write(tx, writerA, &ofA)
			write(tx, writerB, &ofB)
			emit(tx, "", &unowned)
			write(tx, writerNone, &unowned)
		},
		func(tx pgx.Tx) { write(tx, writerB, &ofB) },
		func(tx pgx.Tx) {
			emit(tx, `, "__outbox_table": null`, &unowned)
			emit(tx, `, "__outbox_table": "public.no_such_outbox"`, &nobodys)
			emit(tx, `, "__outbox_table": "Public.Orders_Outbox"`, &nobodys)
			emit(tx, `, "__outbox_table": "public.outbox"`, &ofA)
			write(tx, writerB, &ofB)
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
	recs := readUntil(t, []string{topicA, topicB}, time.Minute, 500*time.Millisecond, waitIDs(all...))
	got := map[string][]string{} // event id → the topics it reached
	for _, r := range recs {
		got[header(r, "id")] = append(got[header(r, "id")], r.Topic)
	}
	for id, topic := range want {
		if g := got[id]; len(g) != 1 || g[0] != topic {
			t.Errorf("event %s reached %v, want %s once", id, g, topic)
		}
	}
	for _, id := range nobodys {
		if g := got[id]; len(g) != 0 {
			t.Errorf("event %s names a table neither deployment streams and reached %v, want none", id, g)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d events delivered, want %d", len(got), len(want))
	}
	t.Logf("A delivered %d of its own and %d unowned, B %d of its own; %d named another table", len(ofA), len(unowned), len(ofB), len(nobodys))
	b.waitLog(`level=WARN msg="a logical message names outbox table public.outbox, not this outboxd's postgres.table public.orders_outbox`, 10*time.Second)
	b.waitLog(`msg="a logical message names no outbox table \(no field __outbox_table\) and router.messages.unowned is ignore`, 10*time.Second)
	a.waitLog(`level=WARN msg="a logical message names outbox table public.orders_outbox, not this outboxd's postgres.table public.outbox`, 10*time.Second)
}
