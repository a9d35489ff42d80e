package test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// allDelivered reports when every committed event has been read at least once.
func allDelivered(l *ledger) func([]*kgo.Record) bool {
	return func(recs []*kgo.Record) bool {
		seen := map[string]bool{}
		for _, r := range recs {
			seen[header(r, "id")] = true
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		for id := range l.committed {
			if !seen[id] {
				return false
			}
		}
		return true
	}
}

// Acceptance 1: exactly the committed events, routed, partitioned and ordered.
func TestDeliversExactlyTheCommittedEvents(t *testing.T) {
	d := newDB(t)
	p := start(t, d.env())
	p.waitStreaming()
	l, topics := deliverMixedLoad(t, d)
	for topic, n := range partitionsOf(t, topics...) {
		if n != 6 {
			t.Errorf("topic %s has %d partitions, want the configured 6", topic, n)
		}
	}
	// Rows that were not deleted are still in the table: their payload::text
	// is the value delivered.
	rows, err := d.pool.Query(context.Background(), `SELECT id::text, payload::text FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, payload string
		if err := rows.Scan(&id, &payload); err != nil {
			t.Fatal(err)
		}
		if e, ok := l.committed[id]; ok && e.Payload != payload {
			t.Errorf("event %s: payload::text %q differs from the value the test expects %q", id, payload, e.Payload)
		}
	}
}

// deliverMixedLoad writes the mixed load (4 writers; 1- to 500-row
// transactions; rollbacks, savepoints, insert-then-delete) through the
// running outboxd and checks what Kafka holds: every committed event, no
// phantom, per-key order, partitions as Java's murmur2, no duplicate.
func deliverMixedLoad(t *testing.T, d *db) (*ledger, []string) {
	t.Helper()
	l := newLedger()
	spec := loadSpec{
		Prefix: d.name, Types: 20, IDs: 100, Writers: 4, Events: 10000,
		TxSizes: []int{1, 10, 500, 1, 10}, RollbackPct: 10, SavepointPct: 20, DeletePct: 30,
	}
	if err := runLoad(context.Background(), d, spec, l); err != nil {
		t.Fatal(err)
	}
	if len(l.rolledBack) == 0 {
		t.Fatal("the load rolled nothing back; the test would prove nothing about phantoms")
	}
	topics := l.topics()
	recs := readUntil(t, topics, 2*time.Minute, 2*time.Second, allDelivered(l))
	r := check(l, recs, partitionsOf(t, topics...))
	t.Logf("%s (committed %d, rolled back %d)", r, l.committedCount(), len(l.rolledBack))
	r.failOnLoss(t)
	if r.Duplicates != 0 {
		t.Errorf("%d duplicates in a clean run", r.Duplicates)
	}
	return l, topics
}

// Acceptance 2a: SIGTERM mid-stream, restart: nothing lost, no duplicates.
func TestSIGTERMRestartLosesNothingAndDuplicatesNothing(t *testing.T) {
	d := newDB(t)
	// No duplicates needs every in-flight record acked within the shutdown
	// timeout; give a loaded CI machine room.
	env := d.env("OUTBOXD_SHUTDOWN_TIMEOUT=60s")
	p := start(t, env)
	p.waitStreaming()

	l := newLedger()
	spec := loadSpec{Prefix: d.name, Types: 5, IDs: 50, Writers: 2, Events: 6000, TxSizes: []int{1, 10, 50}, RollbackPct: 5}
	loadDone := make(chan error, 1)
	go func() { loadDone <- runLoad(context.Background(), d, spec, l) }()

	for i := range 3 {
		waitCommitted(t, l, (i+1)*1000)
		if code := p.stop(syscall.SIGTERM, 90*time.Second); code != 0 {
			t.Fatalf("outboxd exited %d after SIGTERM, want 0", code)
		}
		if !strings.Contains(p.logs.String(), `msg=stopped`) {
			t.Errorf("no 'stopped' line after SIGTERM")
		}
		p = start(t, env)
		p.waitStreaming()
	}
	r := verifyLoad(t, l, loadDone)
	if r.Duplicates != 0 {
		t.Errorf("%d duplicates after SIGTERM restarts, want 0", r.Duplicates)
	}
}

// Acceptance 2b: SIGKILL mid-stream, restart: nothing lost, order intact,
// duplicates only from the unacknowledged window.
func TestSIGKILLRestartLosesNothing(t *testing.T) {
	d := newDB(t)
	env := d.env()
	p := start(t, env)
	p.waitStreaming()

	l := newLedger()
	spec := loadSpec{Prefix: d.name, Types: 5, IDs: 50, Writers: 2, Events: 8000, TxSizes: []int{1, 10, 200}, RollbackPct: 5}
	loadDone := make(chan error, 1)
	go func() { loadDone <- runLoad(context.Background(), d, spec, l) }()

	for i := range 3 {
		waitCommitted(t, l, (i+1)*1500)
		p.stop(syscall.SIGKILL, 10*time.Second)
		p = start(t, env)
		p.waitStreaming()
	}
	r := verifyLoad(t, l, loadDone)
	// Each kill repeats at most what was unconfirmed: bounded by the
	// producer buffer plus one status interval of deliveries.
	if limit := 3 * (10000 + 2000); r.Duplicates > limit {
		t.Errorf("%d duplicates after 3 kills, more than the unacknowledged windows allow (%d)", r.Duplicates, limit)
	}
}

func waitCommitted(t *testing.T, l *ledger, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for l.committedCount() < n {
		if time.Now().After(deadline) {
			t.Fatalf("the load committed only %d events in a minute", l.committedCount())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Acceptance 3: an idle outbox does not pin WAL while other tables take writes.
func TestIdleOutboxSlotKeepsAdvancing(t *testing.T) {
	d := newDB(t)
	d.exec(t, `CREATE TABLE other (id serial PRIMARY KEY, v text)`)
	p := start(t, d.env())
	p.waitStreaming()
	before := d.confirmedFlush(t)
	var lsn0 uint64
	for i := range 20 {
		d.exec(t, `INSERT INTO other (v) SELECT repeat('x', 1000) FROM generate_series(1, 100)`)
		if i == 0 {
			lsn0 = currentLSN(t, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	target := currentLSN(t, d)
	deadline := time.Now().Add(30 * time.Second)
	for d.confirmedFlush(t) < target {
		if time.Now().After(deadline) {
			t.Fatalf("confirmed_flush_lsn stayed at %X (started %X, first write at %X, WAL at %X): an idle outbox pins WAL",
				d.confirmedFlush(t), before, lsn0, target)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func currentLSN(t *testing.T, d *db) uint64 {
	t.Helper()
	var s string
	if err := d.pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return parseLSN(t, s)
}

// Acceptance 4: a 200,000-row transaction streams with bounded memory.
func TestLargeTransactionStreamsInBoundedMemory(t *testing.T) {
	d := newDB(t)
	p := start(t, d.env())
	p.waitStreaming()
	topic := d.name + "_big-events"
	const n = 200000
	d.exec(t, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT $1, 'agg-' || (i % 1000), 'Big', jsonb_build_object('i', i, 'pad', repeat('p', 200))
		FROM generate_series(1, $2) AS i`, d.name+"_big", n)
	cl := kafkaClient(t, topic)
	count := 0
	deadline := time.Now().Add(3 * time.Minute)
	for count < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d records arrived", count, n)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		count += len(cl.PollFetches(ctx).Records())
		cancel()
	}
	if count != n {
		t.Errorf("read %d records, want %d", count, n)
	}
	peak := p.rssPeakKB()
	t.Logf("peak RSS %d MiB for one %d-row transaction", peak/1024, n)
	if peak > 200*1024 {
		t.Errorf("peak RSS %d MiB, want under 200 MiB", peak/1024)
	}
}

// outboxd answers the walsender's keepalives that ask for a reply at once,
// not at its next status update: with wal_sender_timeout 2 s and status
// updates every 30 s, an idle outboxd keeps its connection.
func TestKeepaliveRepliesKeepTheConnection(t *testing.T) {
	d := newDB(t)
	dsn := d.dsn + "&options=-c%20wal_sender_timeout%3D2s"
	p := start(t, replace(d.env("OUTBOXD_POSTGRES_STATUS_INTERVAL=30s"), "OUTBOXD_POSTGRES_DSN", dsn))
	p.waitStreaming()
	time.Sleep(7 * time.Second) // three and a half timeouts, idle
	if n, _ := p.metric("outboxd_relay_restarts_total"); n != 0 {
		t.Fatalf("%g pipeline restarts while idle: the walsender timed out waiting for replies; log:\n%s", n, p.logs.String())
	}
	id, _ := insertEvent(t, d, d.name+"_ka", "k", `{}`)
	readUntil(t, []string{d.name + "_ka-events"}, 30*time.Second, 0, waitIDs(id))
}

// While the pipeline is blocked by backpressure (Kafka stalled, the record
// cap reached), the stream goroutine cannot read the walsender's keepalives
// but still sends its status updates, so Postgres keeps the connection
// (wal_sender_timeout 2 s here) and nothing restarts.
func TestStatusUpdatesWhileBackpressured(t *testing.T) {
	d := newDB(t)
	kProxy := newProxy(t, svc.brokers[0], true)
	dsn := d.dsn + "&options=-c%20wal_sender_timeout%3D2s"
	env := replace(replace(d.env("OUTBOXD_POSTGRES_STATUS_INTERVAL=500ms", "OUTBOXD_KAFKA_MAX_BUFFERED_RECORDS=1"),
		"OUTBOXD_POSTGRES_DSN", dsn), "OUTBOXD_KAFKA_BROKERS", kProxy.Addr())
	p := start(t, env)
	p.waitStreaming()
	typ := d.name + "_bp"
	first, _ := insertEvent(t, d, typ, "k", `{}`)
	readUntil(t, []string{typ + "-events"}, 30*time.Second, 0, waitIDs(first))

	kProxy.Stall()
	var ids []string
	for range 20 {
		id, _ := insertEvent(t, d, typ, "k", `{}`)
		ids = append(ids, id)
	}
	time.Sleep(7 * time.Second) // Kafka stalled for three and a half timeouts
	kProxy.Resume()
	readUntil(t, []string{typ + "-events"}, time.Minute, 0, waitIDs(ids...))
	if n, _ := p.metric("outboxd_relay_restarts_total"); n != 0 {
		t.Fatalf("%g pipeline restarts while backpressured: Postgres timed out waiting for status updates; log:\n%s", n, p.logs.String())
	}
}
