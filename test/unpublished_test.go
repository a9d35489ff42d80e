package test

import (
	"testing"
	"time"
)

// A FOR TABLE publication holds a relation, not a name: an outbox table
// dropped and created again, or replaced by renaming another table to its
// name, is a relation the publication lacks, and Postgres puts none of its
// rows into the slot. outboxd notices it from the catalogue within
// postgres.slot_lag_interval and stops, naming the table and the statement
// to run, instead of streaming on past rows it never sees. A rename alone
// keeps the relation, which goes on flowing (TestRenamedOutboxWhileStreaming).
func TestUnpublishedOutboxStops(t *testing.T) {
	for _, c := range []struct {
		name, sql, want string
	}{
		{"swapped in by rename",
			`CREATE TABLE public.outbox_new (LIKE public.outbox INCLUDING ALL);
			 ALTER TABLE public.outbox RENAME TO outbox_old;
			 ALTER TABLE public.outbox_new RENAME TO outbox`,
			`outbox table public.outbox is not published by publication \\?"outboxd\\?" \(relation \d+; \d+ when the run started\): it was dropped and created again, another table took its name, or it was removed from the publication, while outboxd ran`},
		{"dropped and created again",
			`DROP TABLE public.outbox;
			 CREATE TABLE public.outbox (id uuid PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
			   event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`,
			`outbox table public.outbox is not published by publication \\?"outboxd\\?"`},
		{"dropped", `DROP TABLE public.outbox`,
			`outbox table public.outbox was dropped while outboxd ran \(relation \d+ no longer exists\)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newDB(t)
			p := start(t, d.env())
			p.waitStreaming()
			typ := d.name + "_up"
			before := insertAt(t, d, "outbox", typ, "2026-06-01")
			readUntil(t, []string{typ + "-events"}, 30*time.Second, 0, waitIDs(before))
			d.exec(t, c.sql)
			if c.name != "dropped" {
				insertAt(t, d, "outbox", typ, "2026-06-01") // not in the slot: only the halt tells of it
			}
			if code := p.waitExit(30 * time.Second); code == 0 {
				t.Fatalf("outboxd exited 0; want it to stop on the unpublished table")
			}
			p.waitLog(c.want, time.Second)
			p.waitLog(`run ALTER PUBLICATION "outboxd" ADD TABLE "public"\."outbox"`, time.Second)
			p.waitLog(`send them with outboxd replay -table public.outbox`, time.Second)
		})
	}
}
