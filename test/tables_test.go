package test

import (
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// insertAt writes one event into table with the given created_at, and
// returns its id.
func insertAt(t *testing.T, d *db, table, aggType, createdAt string) string {
	t.Helper()
	id := uuid()
	d.exec(t, `INSERT INTO `+table+` (id, aggregate_type, aggregate_id, event_type, payload, created_at) VALUES ($1, $2, 'k', 'Happened', '{}', $3)`,
		id, aggType, createdAt)
	return id
}

// A partitioned outbox. The publication outboxd creates has
// publish_via_partition_root, so that every row comes under the table's own
// name, also from a partition attached while outboxd runs. One without it is
// refused; rows that it published under a partition's name, still in the
// slot, are delivered, and those of a partition dropped since are said to be
// ignored. A publication of one partition does not cover the table.
func TestPartitionedOutbox(t *testing.T) {
	d := newDB(t)
	d.exec(t, `DROP TABLE outbox`)
	d.exec(t, `CREATE TABLE outbox (
		id uuid NOT NULL DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
		event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`)
	d.exec(t, `CREATE TABLE outbox_2019 PARTITION OF outbox FOR VALUES FROM ('2019-01-01') TO ('2020-01-01')`)
	d.exec(t, `CREATE TABLE outbox_rest PARTITION OF outbox DEFAULT`)
	typ := d.name + "_part"
	topic := []string{typ + "-events"}

	// outboxd migrate leaves out the idempotency key, whose unique index a
	// partitioned table cannot take, and says so.
	migrate := exec.Command(svc.bin, "migrate")
	migrate.Env = d.env()
	if out, err := migrate.CombinedOutput(); err != nil || !strings.Contains(string(out), `msg="migration skipped" migration=0002_idempotency_key.sql`) {
		t.Errorf("outboxd migrate on a partitioned outbox: %v, want success and a warning that 0002 was skipped:\n%s", err, out)
	}

	p := start(t, d.env())
	p.waitStreaming()
	var viaRoot bool
	if err := d.pool.QueryRow(context.Background(), `SELECT pubviaroot FROM pg_publication WHERE pubname = 'outboxd'`).Scan(&viaRoot); err != nil || !viaRoot {
		t.Fatalf("publication outboxd: publish_via_partition_root = %v (%v), want true", viaRoot, err)
	}
	want := []string{insertAt(t, d, "outbox", typ, "2019-06-01"), insertAt(t, d, "outbox", typ, "2026-06-01")}
	d.exec(t, `CREATE TABLE outbox_2030 PARTITION OF outbox FOR VALUES FROM ('2030-01-01') TO ('2031-01-01')`)
	want = append(want, insertAt(t, d, "outbox", typ, "2030-06-01"))
	readUntil(t, topic, 30*time.Second, 0, waitIDs(want...))
	p.stop(syscall.SIGTERM, 30*time.Second)

	d.exec(t, `ALTER PUBLICATION outboxd SET (publish_via_partition_root = false)`)
	byName := insertAt(t, d, "outbox", typ, "2026-07-01")  // published as outbox_rest's
	dropped := insertAt(t, d, "outbox", typ, "2019-07-01") // as outbox_2019's, which goes
	expectStartupError(t, d.env(), `the outbox table public.outbox is partitioned, and publication \\?"outboxd\\?" publishes its rows under each partition's name; `+
		`run ALTER PUBLICATION \\?"outboxd\\?" SET \(publish_via_partition_root = true\)`)
	d.exec(t, `ALTER PUBLICATION outboxd SET (publish_via_partition_root = true)`)
	d.exec(t, `DROP TABLE outbox_2019`)
	byRoot := insertAt(t, d, "outbox", typ, "2026-08-01")
	p = start(t, d.env())
	p.waitStreaming()
	recs := readUntil(t, topic, 30*time.Second, 2*time.Second, waitIDs(byName, byRoot))
	p.waitLog(`delivering the rows of public.outbox_rest as outbox events: it is a partition of the outbox table`, time.Second)
	p.waitLog(`level=WARN msg="ignoring the changes to public.outbox_2019, a table dropped since`, time.Second)
	if ids(recs)[dropped] != nil {
		t.Errorf("the event of the dropped partition was delivered: the test no longer shows what the warning is for")
	}
	p.stop(syscall.SIGTERM, 30*time.Second)

	// Every partition, but not the table: one attached later would not be in it.
	d.exec(t, `CREATE PUBLICATION leaves FOR TABLE outbox_rest, outbox_2030 WITH (publish_via_partition_root = true)`)
	expectStartupError(t, d.env("OUTBOXD_POSTGRES_PUBLICATION=leaves"), `publication \\?"leaves\\?" does not include public.outbox; run ALTER PUBLICATION \\?"leaves\\?" ADD TABLE \\?"public\\?".\\?"outbox\\?". Rows of it written before that statement are not published and never reach outboxd: send them with outboxd replay`)
}

// A row filter on the outbox table: Postgres never decodes the rows it
// leaves out, so outboxd refuses the publication.
func TestPublicationRowFilterIsRefused(t *testing.T) {
	d := newDB(t)
	const stmt = `CREATE PUBLICATION outboxd FOR TABLE public.outbox WHERE (aggregate_type <> 'internal') WITH (publish = 'insert')`
	if refusedBefore(t, d, 15, stmt) {
		return
	}
	d.exec(t, stmt)
	expectStartupError(t, d.env(), `publication \\?"outboxd\\?" publishes only the rows of public.outbox WHERE \\?\(aggregate_type <> 'internal'`)
}

// A Postgres 15 column list on the outbox table: columns it leaves out never
// reach outboxd, so a list without one that outboxd reads is refused at
// start-up, naming them; a list with all of them is fine.
func TestPublicationColumnList(t *testing.T) {
	t.Run("missing columns are refused", func(t *testing.T) {
		d := newDB(t)
		const stmt = `CREATE PUBLICATION outboxd FOR TABLE public.outbox (id, aggregate_type, aggregate_id) WITH (publish = 'insert')`
		if refusedBefore(t, d, 15, stmt) {
			return
		}
		d.exec(t, stmt)
		expectStartupError(t, d.env(), `publication \\?"outboxd\\?" publishes only the columns id, aggregate_type, aggregate_id of public.outbox, and outboxd reads payload, event_type too`)
	})
	t.Run("every column outboxd reads is enough", func(t *testing.T) {
		d := newDB(t)
		const stmt = `CREATE PUBLICATION outboxd FOR TABLE public.outbox (id, aggregate_type, aggregate_id, event_type, payload) WITH (publish = 'insert')`
		if refusedBefore(t, d, 15, stmt) {
			return
		}
		d.exec(t, stmt)
		p := start(t, d.env())
		p.waitStreaming()
		typ := d.name + "_cols"
		id, _ := insertEvent(t, d, typ, "k", `{"a": 1}`)
		readUntil(t, []string{typ + "-events"}, 30*time.Second, 0, waitIDs(id))
	})
}

// Rows of other tables in the publication, among them a table that
// inherits from the outbox table, are not delivered, and are said to be
// ignored.
func TestOtherTablesAreIgnored(t *testing.T) {
	d := newDB(t)
	d.exec(t, `CREATE TABLE orders (id int PRIMARY KEY)`)
	d.exec(t, `CREATE TABLE outbox_archive () INHERITS (outbox)`)
	d.exec(t, `CREATE PUBLICATION outboxd FOR TABLE public.outbox, public.orders WITH (publish = 'insert, update')`)
	p := start(t, d.env())
	p.waitStreaming()

	d.exec(t, `INSERT INTO orders VALUES (1)`)
	child := insertAt(t, d, "outbox_archive", d.name+"_oth", "2026-06-01")
	own := insertAt(t, d, "outbox", d.name+"_oth", "2026-06-01")
	recs := readUntil(t, []string{d.name + "_oth-events"}, 30*time.Second, 2*time.Second, waitIDs(own))
	p.waitLog(`level=WARN msg="ignoring the changes to public.orders: the publication publishes it, but it is not the outbox table`, time.Second)
	p.waitLog(`ignoring the changes to public.outbox_archive: `, time.Second)
	if ids(recs)[child] != nil {
		t.Error("the row of a table that inherits from the outbox table was delivered")
	}
	if v, _ := p.metricLabelled(`outboxd_wal_changes_total{op="insert",table="public.outbox"}`); v != 1 {
		t.Errorf(`outboxd_wal_changes_total{op="insert"} = %v, want 1: the outbox's row only`, v)
	}
}

// The renamed outbox keeps its relation ID: its rows are still delivered
// while outboxd runs, and a restart then says that the configured table is
// gone.
func TestRenamedOutboxWhileStreaming(t *testing.T) {
	d := newDB(t)
	p := start(t, d.env())
	p.waitStreaming()
	// Renamed before the run has seen a row of it.
	d.exec(t, `ALTER TABLE outbox RENAME TO outbox_renamed`)
	after := insertAt(t, d, "outbox_renamed", d.name+"_ren", "2026-06-01")
	readUntil(t, []string{d.name + "_ren-events"}, 30*time.Second, 0, waitIDs(after))
	p.stop(syscall.SIGTERM, 30*time.Second)
	expectStartupError(t, d.env(), `outbox table public.outbox does not exist`)
}

// pgoutput names a column's declared type: for a domain, the domain. A
// payload of a domain over bytea (here two deep) is still delivered as its
// raw bytes, not as bytea's hex text.
func TestDomainTypedPayload(t *testing.T) {
	d := newDB(t)
	d.exec(t, `CREATE DOMAIN raw_bytes AS bytea`)
	d.exec(t, `CREATE DOMAIN event_bytes AS raw_bytes CHECK (length(VALUE) < 1000000)`)
	d.exec(t, `ALTER TABLE outbox ALTER COLUMN payload TYPE event_bytes USING convert_to(payload::text, 'UTF8')`)
	p := start(t, d.env())
	p.waitStreaming()
	id := uuid()
	d.exec(t, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, 'k', 'Happened', '\x00ff01'::bytea)`,
		id, d.name+"_dom")
	recs := readUntil(t, []string{d.name + "_dom-events"}, 30*time.Second, 0, waitIDs(id))
	if r := ids(recs)[id]; r != nil && string(r.Value) != "\x00\xff\x01" {
		t.Errorf("value %q, want the raw bytes 00 ff 01", r.Value)
	}
}
