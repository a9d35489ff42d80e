package test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Exactly-once mode (issue 26): kafka.delivery: exactly_once, checked by a
// read_committed consumer. Besides no loss, no phantoms and per-key order,
// these tests require 0 duplicates.

// eosEnv is d's environment in exactly-once mode, with a positions topic
// of the test's own.
func eosEnv(d *db, extra ...string) []string {
	return d.env(append([]string{
		"OUTBOXD_KAFKA_DELIVERY=exactly_once",
		"OUTBOXD_KAFKA_POSITIONS_TOPIC=" + d.name + "-positions",
	}, extra...)...)
}

// collectCommitted is collect with isolation.level=read_committed: what an
// exactly-once consumer sees.
func collectCommitted(t *testing.T, brokers []string, topics []string) *collector {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.MetadataMinAge(250*time.Millisecond),
		kgo.FetchMaxWait(200*time.Millisecond),
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &collector{seen: map[string]bool{}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer cl.Close()
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			recs := fs.Records()
			c.mu.Lock()
			for _, r := range recs {
				c.recs = append(c.recs, r)
				c.seen[header(r, "id")] = true
			}
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-c.done })
	return c
}

// startEOSRun is startFaultRun with a read_committed collector.
func startEOSRun(t *testing.T, d *db, brokers []string, spec loadSpec) *faultRun {
	t.Helper()
	if spec.Truth {
		d.exec(t, `CREATE TABLE IF NOT EXISTS outbox_truth (id uuid PRIMARY KEY)`)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &faultRun{t: t, d: d, brokers: brokers, spec: spec, l: newLedger(), loadDone: make(chan error, 1), cancel: cancel}
	t.Cleanup(cancel)
	f.c = collectCommitted(t, brokers, topicsFor(spec))
	go func() { f.loadDone <- runLoad(ctx, d, spec, f.l) }()
	return f
}

// noDuplicates fails t for any event a read_committed consumer saw twice.
func noDuplicates(t *testing.T, r report) {
	t.Helper()
	if r.Duplicates > 0 {
		t.Errorf("%d duplicates in exactly-once mode, want 0", r.Duplicates)
	}
}

var resumeRE = regexp.MustCompile(`exactly-once: resuming after the position committed in Kafka.* lsn=(\S+) split_txn=(\S+) split_rows=(\d+)`)

// Acceptance 1: SIGKILL outboxd at random moments during a mixed load
// (rollbacks, savepoints, insert-then-delete, 1- to 500-row transactions,
// 4 writers); restart it each time.
func TestExactlyOnceSIGKILL(t *testing.T) {
	d := newDB(t)
	env := eosEnv(d, "OUTBOXD_KAFKA_MAX_BUFFERED_RECORDS=2000")
	p := start(t, env)
	p.waitStreaming()
	spec := loadSpec{Prefix: d.name, Types: 6, IDs: 60, Writers: 4,
		Events: pick(60000, 150000), TxSizes: []int{1, 10, 200, 1, 500, 5, 50}, RollbackPct: 5, SavepointPct: 10, DeletePct: 20,
		Pace: 200 * time.Millisecond} // about 2,000 events/s: a restart takes a second or two
	f := startEOSRun(t, d, svc.brokers, spec)
	kills, open := pick(12, 20), 0
	for i := range kills {
		waitCommitted(t, f.l, (i+1)*spec.Events*9/10/(kills+1))
		sleepRand(0, 300*time.Millisecond)
		if v, ok := p.metric("outboxd_sink_records_in_flight"); ok && v > 0 {
			open++ // killed with records in an open Kafka transaction
		}
		p.stop(syscall.SIGKILL, 10*time.Second)
		p = start(t, env)
		p.waitStreaming()
		p.waitLog(`exactly-once: resuming`, 30*time.Second)
		t.Logf("kill %d at %d committed events", i+1, f.l.committedCount())
	}
	faultEnd := time.Now()
	r := f.finish("exactly-once: SIGKILL outboxd", kills, faultEnd, fmt.Sprintf("%d of %d kills with a Kafka transaction open", open, kills))
	noDuplicates(t, r)
	if m := resumeRE.FindStringSubmatch(p.logs.String()); m == nil || m[1] == "0/0" {
		t.Errorf("the last restart did not resume from a position in Kafka: %q", m)
	}
}

// Acceptance 2: two instances; the active one is paused (SIGSTOP) until the
// standby takes over, then resumed. The resumed one is fenced: it writes
// nothing a read_committed consumer sees, says so, and goes back to
// standby.
func TestExactlyOnceFencing(t *testing.T) {
	d := newDB(t)
	env := eosEnv(d, "OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=200ms")
	a := start(t, env)
	a.waitStreaming()
	b := start(t, env)
	b.waitLog(`msg="standby: another process holds the slot`, 30*time.Second)
	spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 4,
		Events: pick(8000, 40000), TxSizes: []int{1, 10, 100, 3}, RollbackPct: 5, SavepointPct: 10, DeletePct: 20,
		Pace: 5 * time.Millisecond}
	f := startEOSRun(t, d, svc.brokers, spec)
	waitCommitted(t, f.l, spec.Events/4)
	// Pause A mid-load, with records in flight most likely, and end its
	// walsender as Postgres would after wal_sender_timeout.
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	deadline := time.Now().Add(30 * time.Second)
	for !regexp.MustCompile(`took over the slot from the previous holder`).MatchString(b.logs.String()) {
		if time.Now().After(deadline) {
			_ = a.cmd.Process.Signal(syscall.SIGCONT)
			t.Fatalf("the standby did not take over within 30s; log:\n%s", b.logs.String())
		}
		_, _ = d.pool.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active`, d.slot)
		time.Sleep(200 * time.Millisecond)
	}
	b.waitLog(`exactly-once: resuming`, 30*time.Second)
	// Let B deliver for a while, then resume A.
	waitCommitted(t, f.l, f.l.committedCount()+spec.Events/8)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("A paused for %s", time.Since(paused).Round(time.Millisecond))
	a.waitLog(`another outboxd took over: Kafka fenced transactional id`, 60*time.Second)
	a.waitLog(`msg="standby: another process holds the slot`, 60*time.Second)
	r := f.finish("exactly-once: fenced instance resumed", 1, time.Now(), "SIGSTOP the active instance, the standby takes over, SIGCONT")
	noDuplicates(t, r)
	select {
	case <-a.done:
		t.Errorf("the fenced instance exited (%v) instead of going back to standby", a.err)
	default:
	}
}

// Acceptance 3: a Postgres transaction larger than one Kafka transaction
// may hold (kafka.transaction_max_bytes) is split; outboxd is killed in the
// middle of it and restarted, and a restart skips exactly the rows the
// committed part holds: every row once.
func TestExactlyOnceSplitTransaction(t *testing.T) {
	d := newDB(t)
	env := eosEnv(d, "OUTBOXD_KAFKA_TRANSACTION_MAX_BYTES=65536")
	p := start(t, env)
	p.waitStreaming()
	rows := pick(30000, 100000)
	spec := loadSpec{Prefix: d.name, Types: 3, IDs: 30, Writers: 1, Events: rows, TxSizes: []int{rows}, PayloadBytes: 300}
	f := startEOSRun(t, d, svc.brokers, spec)
	// Kill once part of the transaction is visible, before all of it is.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		n := len(f.c.records())
		if n >= rows/10 {
			if n >= rows {
				t.Fatalf("the whole transaction (%d rows) was delivered before the kill; make it larger", rows)
			}
			t.Logf("killing with %d of %d rows visible", n, rows)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d rows of the transaction visible after 2 minutes", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.stop(syscall.SIGKILL, 10*time.Second)
	p = start(t, env)
	p.waitStreaming()
	m := resumeRE.FindStringSubmatch(p.waitLog(resumeRE.String(), 30*time.Second))
	if n, _ := strconv.Atoi(m[3]); n == 0 || m[2] == "0/0" {
		t.Errorf("the restart did not resume inside the split transaction: split_txn=%s split_rows=%s", m[2], m[3])
	}
	r := f.finish("exactly-once: split transaction killed", 1, time.Now(), fmt.Sprintf("one %d-row transaction, restarted %s rows in", rows, m[3]))
	noDuplicates(t, r)
}
