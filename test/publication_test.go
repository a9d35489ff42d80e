package test

import (
	"context"
	"testing"
	"time"
)

// publishes returns which actions publication name publishes.
func publishes(t *testing.T, d *db, name string) (insert, update, delete, truncate bool) {
	t.Helper()
	err := d.pool.QueryRow(context.Background(), `SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1`, name).
		Scan(&insert, &update, &delete, &truncate)
	if err != nil {
		t.Fatalf("reading publication %s: %v", name, err)
	}
	return
}

// The publication outboxd creates publishes inserts and updates only. With
// insert-then-delete, a published DELETE per event would be decoded and sent
// for nothing (BENCHMARKS.md: a third less throughput).
func TestCreatedPublicationLeavesOutDeletes(t *testing.T) {
	d := newDB(t)
	p := start(t, d.env())
	p.waitStreaming()
	p.waitLog(`msg="created publication" publication=outboxd table=public.outbox publish="insert, update"`, time.Second)
	if ins, upd, del, trunc := publishes(t, d, "outboxd"); !ins || !upd || del || trunc {
		t.Fatalf("publication outboxd publishes insert=%v update=%v delete=%v truncate=%v, want only inserts and updates", ins, upd, del, trunc)
	}

	// Insert-then-delete in one transaction: the event is delivered, and the
	// delete never reaches outboxd.
	ctx := context.Background()
	id := uuid()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, q := range []string{insertSQL, `DELETE FROM outbox WHERE id = $1`} {
		args := []any{id}
		if q == insertSQL {
			args = append(args, d.name+"_p", "k", "Happened", `{"a":1}`)
		}
		if _, err := tx.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	readUntil(t, []string{d.name + "_p-events"}, time.Minute, 0, waitIDs(id))

	// An UPDATE is still seen: router.on_update (warn by default) reports it.
	id2, _ := insertEvent(t, d, d.name+"_p", "k", `{}`)
	d.exec(t, `UPDATE outbox SET event_type = 'Changed' WHERE id = $1`, id2)
	p.waitLog(`UPDATE on the outbox table is not delivered`, 30*time.Second)
	if v, ok := p.metricLabelled(`outboxd_wal_changes_total{op="update",table="public.outbox"}`); v != 1 {
		t.Errorf(`outboxd_wal_changes_total{op="update"} = %v (present %v), want 1`, v, ok)
	}
	if v, _ := p.metricLabelled(`outboxd_wal_changes_total{op="delete",table="public.outbox"}`); v != 0 {
		t.Errorf(`outboxd_wal_changes_total{op="delete"} = %v, want 0: the publication leaves deletes out`, v)
	}
}

// A publication that already publishes DELETEs (a plain FOR TABLE, or
// Debezium's) is used as it is, with a hint that says how to leave them out.
func TestExistingPublicationOfDeletesIsHinted(t *testing.T) {
	d := newDB(t)
	d.exec(t, `CREATE PUBLICATION outboxd FOR TABLE public.outbox`)
	p := start(t, d.env())
	p.waitStreaming()
	p.waitLog(`publishes DELETEs, which outboxd ignores.*ALTER PUBLICATION \\?"outboxd\\?" SET \(publish = 'insert, update'\)`, time.Second)
	if _, _, del, _ := publishes(t, d, "outboxd"); !del {
		t.Error("outboxd changed an existing publication; it must only hint")
	}
}

// A publication without INSERTs would deliver nothing: outboxd refuses it
// and says how to fix it. One without UPDATEs is used, with a warning that
// router.on_update cannot see them.
func TestPublicationWithoutInsertsIsRefused(t *testing.T) {
	d := newDB(t)
	d.exec(t, `CREATE PUBLICATION outboxd FOR TABLE public.outbox WITH (publish = 'update, delete')`)
	expectStartupError(t, d.env(), `publication \\?"outboxd\\?" does not publish INSERTs, so no event would reach outboxd; `+
		`run ALTER PUBLICATION \\?"outboxd\\?" SET \(publish = 'insert, update'\)`)

	d.exec(t, `ALTER PUBLICATION outboxd SET (publish = 'insert')`)
	p := start(t, d.env())
	p.waitStreaming()
	p.waitLog(`level=WARN msg="the publication leaves UPDATEs out, so router.on_update \(warn\) never sees`, time.Second)
}
