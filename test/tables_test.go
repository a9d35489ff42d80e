package test

import (
	"syscall"
	"testing"
	"time"
)

// insertAt writes one event into table (the outbox or a table that
// inherits from it) with the given created_at, and returns its id.
func insertAt(t *testing.T, d *db, table, aggType, createdAt string) string {
	t.Helper()
	id := uuid()
	d.exec(t, `INSERT INTO `+table+` (id, aggregate_type, aggregate_id, event_type, payload, created_at) VALUES ($1, $2, 'k', 'Happened', '{}', $3)`,
		id, aggType, createdAt)
	return id
}

// A partitioned outbox: without publish_via_partition_root, Postgres
// publishes each row under its partition's name. Those rows are outbox
// events, also in a partition attached while outboxd runs, and the
// publication covers the table on a restart.
func TestPartitionedOutboxIsDelivered(t *testing.T) {
	d := newDB(t)
	d.exec(t, `DROP TABLE outbox`)
	d.exec(t, `CREATE TABLE outbox (
		id uuid NOT NULL DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
		event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`)
	d.exec(t, `CREATE TABLE outbox_2019 PARTITION OF outbox FOR VALUES FROM ('2019-01-01') TO ('2020-01-01')`)
	d.exec(t, `CREATE TABLE outbox_rest PARTITION OF outbox DEFAULT`)
	topic := d.name + "_part-events"

	p := start(t, d.env())
	p.waitStreaming()
	ids := []string{insertAt(t, d, "outbox", d.name+"_part", "2019-06-01"), insertAt(t, d, "outbox", d.name+"_part", "2026-06-01")}
	d.exec(t, `CREATE TABLE outbox_2030 PARTITION OF outbox FOR VALUES FROM ('2030-01-01') TO ('2031-01-01')`)
	ids = append(ids, insertAt(t, d, "outbox", d.name+"_part", "2030-06-01"))
	readUntil(t, []string{topic}, 30*time.Second, 0, waitIDs(ids...))
	p.waitLog(`delivering the rows of public.outbox_2019 as outbox events`, time.Second)
	p.stop(syscall.SIGTERM, 30*time.Second)

	// The existing publication lists the partitions, not the table: it
	// still covers it. With publish_via_partition_root the rows come under
	// the table's own name.
	p = start(t, d.env())
	p.waitStreaming()
	ids = append(ids, insertAt(t, d, "outbox", d.name+"_part", "2030-07-01"))
	d.exec(t, `ALTER PUBLICATION outboxd SET (publish_via_partition_root = true)`)
	ids = append(ids, insertAt(t, d, "outbox", d.name+"_part", "2019-07-01"))
	readUntil(t, []string{topic}, 30*time.Second, 0, waitIDs(ids...))
}

// Rows of a table that inherits from the outbox, created while outboxd
// runs, are outbox events; a table that the publication also publishes is
// not, and is said to be ignored.
func TestInheritedAndOtherTables(t *testing.T) {
	d := newDB(t)
	d.exec(t, `CREATE TABLE orders (id int PRIMARY KEY)`)
	d.exec(t, `CREATE PUBLICATION outboxd FOR TABLE public.outbox, public.orders WITH (publish = 'insert, update')`)
	p := start(t, d.env())
	p.waitStreaming()

	d.exec(t, `CREATE TABLE outbox_archive () INHERITS (outbox)`)
	d.exec(t, `ALTER PUBLICATION outboxd ADD TABLE outbox_archive`)
	d.exec(t, `INSERT INTO orders VALUES (1)`)
	child := insertAt(t, d, "outbox_archive", d.name+"_inh", "2026-06-01")
	own := insertAt(t, d, "outbox", d.name+"_inh", "2026-06-01")
	readUntil(t, []string{d.name + "_inh-events"}, 30*time.Second, 0, waitIDs(child, own))
	p.waitLog(`ignoring the changes to public.orders: the publication publishes it, but it is not the outbox table`, time.Second)
	p.waitLog(`delivering the rows of public.outbox_archive as outbox events`, time.Second)
	if v, _ := p.metricLabelled(`outboxd_wal_changes_total{op="insert"}`); v != 2 {
		t.Errorf(`outboxd_wal_changes_total{op="insert"} = %v, want 2: the outbox's and its child's, not the orders row`, v)
	}
}

// The renamed outbox keeps its relation ID: its rows are still delivered
// while outboxd runs, and a restart then says that the configured table is
// gone.
func TestRenamedOutboxWhileStreaming(t *testing.T) {
	d := newDB(t)
	p := start(t, d.env())
	p.waitStreaming()
	first := insertAt(t, d, "outbox", d.name+"_ren", "2026-06-01")
	readUntil(t, []string{d.name + "_ren-events"}, 30*time.Second, 0, waitIDs(first))
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
