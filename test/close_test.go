package test

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/wal"
)

// A stop while Postgres is sending a large transaction. A walsender in the
// middle of one reads its client's messages only when its writes block, so
// a final status update sent to it while the stream is read as fast as it
// comes stays unread until the transaction has been sent; closing before
// then loses the update, and a restart repeats what was delivered before.
// Close must leave the slot at the position it reported.
func TestCloseDuringALargeTransactionAppliesTheFinalStatus(t *testing.T) {
	d := newDB(t)
	ctx := context.Background()
	d.exec(t, `CREATE PUBLICATION outboxd FOR TABLE outbox`)
	d.exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, d.slot)
	d.exec(t, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', '1', 'A', '{}')`)

	repl := d.replicationConn(t)
	var position atomic.Uint64 // what the test lets the stream confirm
	stream, err := wal.StartStream(ctx, repl, wal.StreamConfig{Slot: d.slot, Publication: "outboxd", StatusInterval: time.Minute},
		0, func() wal.LSN { return wal.LSN(position.Load()) })
	if err != nil {
		t.Fatal(err)
	}
	slotConn, err := pgx.Connect(ctx, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer slotConn.Close(ctx)
	stream.SlotPosition = func(ctx context.Context) (wal.LSN, error) {
		info, _, err := wal.InspectSlot(ctx, slotConn, d.slot)
		return info.ConfirmedFlushLSN, err
	}

	// The stream is read as fast as it comes, as the relay reads it.
	run, stop := context.WithCancel(ctx)
	items := make(chan []wal.Item, 8)
	runErr := make(chan error, 1)
	go func() { defer close(items); runErr <- stream.Run(run, run, items) }()
	ran := false // Run has returned: the connection is the test's again
	defer func() {
		if !ran {
			stop()
			<-runErr
		}
	}()
	commits, changes := make(chan wal.LSN, 1), make(chan struct{}, 1)
	go func() {
		for batch := range items {
			for _, it := range batch {
				switch it := it.(type) {
				case *wal.Commit:
					select {
					case commits <- it.EndLSN:
					default:
					}
				case *wal.Change:
					if string(it.Tuple[1].Data) == "b" { // aggregate_type
						select {
						case changes <- struct{}{}:
						default:
						}
					}
				}
			}
		}
	}()
	var delivered wal.LSN // transaction A's end, counted as delivered below
	select {
	case delivered = <-commits:
	case <-time.After(30 * time.Second):
		t.Fatal("the first transaction did not arrive within 30 s")
	}
	// Transaction B: rows that take the walsender about 0.8 ms each to send
	// (a 200 KB jsonb value each, copied in compressed from src): about 10 s
	// here, far longer than Close may take, so that reading to the end of
	// the stream cannot pass this test.
	d.exec(t, `CREATE TABLE src AS SELECT jsonb_build_object('pad', repeat('x', 200000)) AS v`)
	d.exec(t, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'b', i::text, 'B', (SELECT v FROM src) FROM generate_series(1, 12000) AS i`)
	select {
	case <-changes:
	case <-time.After(30 * time.Second):
		t.Fatal("the large transaction did not arrive within 30 s")
	}
	// A is delivered now, while the walsender is busy with B; stop at once
	// and close, as the relay does after a shutdown timeout.
	position.Store(uint64(delivered))
	stop()
	<-runErr
	ran = true
	closeCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	if err := stream.Close(closeCtx); err != nil {
		t.Errorf("Close: %v", err)
	}
	t.Logf("Close took %s", time.Since(start).Round(time.Millisecond))

	// The walsender may still be on its way out: read the slot once it has
	// let go of it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, _, err := wal.InspectSlot(ctx, slotConn, d.slot)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Active {
			if info.ConfirmedFlushLSN < delivered {
				t.Fatalf("the slot is at %s after Close, behind the delivered %s: a restart repeats the first transaction",
					info.ConfirmedFlushLSN, delivered)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the walsender still holds the slot 30 s after Close")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A stop on an idle stream ends it cleanly: the server answers the
// CopyDone at once, and Close has no reason to read the slot. Run must
// leave no wake-up behind that cuts Close's reads short (one did: a
// goroutine of context.AfterFunc could move the read deadline to the past
// after Run had returned).
func TestCloseOnAnIdleStreamEndsCleanly(t *testing.T) {
	d := newDB(t)
	ctx := context.Background()
	d.exec(t, `CREATE PUBLICATION outboxd FOR TABLE outbox`)
	d.exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, d.slot)
	for i := range 20 {
		stream, err := wal.StartStream(ctx, d.replicationConn(t), wal.StreamConfig{Slot: d.slot, Publication: "outboxd", StatusInterval: time.Minute},
			0, func() wal.LSN { return 0 })
		if err != nil {
			t.Fatal(err)
		}
		var reads atomic.Int32
		stream.SlotPosition = func(context.Context) (wal.LSN, error) {
			reads.Add(1)
			return 0, nil
		}
		run, stop := context.WithCancel(ctx)
		items := make(chan []wal.Item, 8)
		runErr := make(chan error, 1)
		go func() { defer close(items); runErr <- stream.Run(run, run, items) }()
		time.Sleep(time.Duration(i%4) * time.Millisecond)
		stop()
		for range items {
		}
		<-runErr
		closeCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = stream.Close(closeCtx)
		cancel()
		if err != nil || reads.Load() > 0 {
			t.Fatalf("stop %d: Close on an idle stream returned %v after %d reads of the slot, want a clean end and none", i, err, reads.Load())
		}
	}
}

// The same stop through outboxd: SIGTERM while Postgres sends a large
// transaction, with a shutdown_timeout shorter than the transaction. The
// transaction delivered before it must stay confirmed (no status is sent
// on the 30 s keepalive timer or for a new position in between: only the
// final one can confirm it).
func TestSIGTERMDuringALargeTransactionKeepsTheDeliveredOneConfirmed(t *testing.T) {
	d := newDB(t)
	p := start(t, d.env("OUTBOXD_POSTGRES_STATUS_INTERVAL=30s", "OUTBOXD_POSTGRES_CONFIRM_INTERVAL=30s", "OUTBOXD_SHUTDOWN_TIMEOUT=200ms"))
	p.waitStreaming()
	before := d.confirmedFlush(t)
	topic := d.name + "_a-events"
	// delivered is a position inside transaction A: the slot is past it
	// once A is confirmed, and before it until then.
	ctx := context.Background()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var at string
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, '1', 'A', '{}')`, d.name+"_a"); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&at); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	delivered := parseLSN(t, at)
	readUntil(t, []string{topic}, 30*time.Second, 0, func(r []*kgo.Record) bool { return len(r) == 1 })
	d.exec(t, `CREATE TABLE src AS SELECT jsonb_build_object('pad', repeat('x', 200000)) AS v`)
	d.exec(t, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT $1, i::text, 'B', (SELECT v FROM src) FROM generate_series(1, 12000) AS i`, d.name+"_b")
	time.Sleep(300 * time.Millisecond) // into the large transaction
	if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if got := d.confirmedFlush(t); got < delivered {
		t.Fatalf("the slot is at %X after the stop (it was at %X before the first transaction, and %X is inside it): a restart sends it again",
			got, before, delivered)
	}
}
