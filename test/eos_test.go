package test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
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
	return collect(t, brokers, topics, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
}

// startEOSRun is startFaultRun with a read_committed collector.
func startEOSRun(t *testing.T, d *db, brokers []string, spec loadSpec) *faultRun {
	t.Helper()
	return startFaultRun(t, d, brokers, spec, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
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
	// Let B deliver for a while, then resume A. The load commits fewer
	// than spec.Events (rollbacks), and may be nearly done by now.
	waitCommitted(t, f.l, min(f.l.committedCount()+spec.Events/8, spec.Events*3/4))
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("A paused for %s", time.Since(paused).Round(time.Millisecond))
	t.Logf("A: %s", a.waitLog(`another outboxd took over: Kafka fenced transactional id[^\n]*`, 60*time.Second))
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

// Acceptance 1, broker variant: the broker (of the test's own) is SIGKILLed
// and restarted during the load, then restarted cleanly.
func TestExactlyOnceBrokerSIGKILL(t *testing.T) {
	k := startOwnKafka(t, false)
	d := newDB(t)
	env := replace(eosEnv(d), "OUTBOXD_KAFKA_BROKERS", k.brokers[0])
	p := start(t, env)
	p.waitStreaming()
	spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 4,
		Events: pick(20000, 200000), TxSizes: []int{1, 10, 100, 500, 3}, RollbackPct: 5, SavepointPct: 10, DeletePct: 20,
		Pace: 200 * time.Millisecond}
	f := startEOSRun(t, d, k.brokers, spec)
	kills := pick(1, 3)
	for range kills {
		// Not right after the topics' creation: a broker killed then once
		// found their logs stray and was not ready 90 s after its restart.
		// Each kill takes about 20 s, so the long run's load is long
		// enough for three (about 80 s); a kill is never waited for past
		// 90 % of the load, which (with rollbacks) may never commit more.
		waitCommitted(t, f.l, min(f.l.committedCount()+3000, spec.Events*9/10))
		k.run("kafka-kill")
		time.Sleep(10 * time.Second)
		t.Logf("broker restarted in %s", k.run("kafka-start"))
	}
	time.Sleep(3 * time.Second)
	k.run("kafka-stop") // clean restart
	t.Logf("clean broker restart in %s", k.run("kafka-start"))
	r := f.finish("exactly-once: Kafka broker SIGKILL + clean restart", kills+1, time.Now(),
		fmt.Sprintf("%d kills, 1 clean restart; outboxd restarts %s", kills, restarts(p)))
	noDuplicates(t, r)
	select {
	case <-p.done:
		t.Errorf("outboxd exited during the broker outage: %v", p.err)
	default:
	}
}

// Acceptance 1, Postgres variant: Postgres (of the test's own) restarted
// mid-stream, with a fast and an immediate shutdown.
func TestExactlyOncePostgresRestart(t *testing.T) {
	pg := startOwnPostgres(t)
	d := outboxDB(t, pg.dsn)
	d.name, d.slot = "t_eospg_"+randomSuffix(), "outboxd_eos"
	p := start(t, eosEnv(d))
	p.waitStreaming()
	spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 4,
		Events: pick(12000, 60000), TxSizes: []int{1, 10, 100, 500}, RollbackPct: 5, SavepointPct: 10, DeletePct: 20,
		Truth: true, Tolerant: true}
	f := startEOSRun(t, d, svc.brokers, spec)
	modes := pick([]string{"fast", "immediate"}, []string{"fast", "immediate", "fast", "immediate", "immediate"})
	for _, mode := range modes {
		waitCommitted(t, f.l, f.l.committedCount()+1500)
		pg.stop(mode)
		time.Sleep(2 * time.Second)
		pg.script("pg-start")
		t.Logf("Postgres restarted after shutdown mode %s at %d committed events", mode, f.l.committedCount())
	}
	r := f.finish("exactly-once: Postgres restart (fast, immediate)", len(modes), time.Now(), fmt.Sprintf("shutdowns %v; outboxd restarts %s", modes, restarts(p)))
	noDuplicates(t, r)
	select {
	case <-p.done:
		t.Errorf("outboxd exited across Postgres restarts: %v", p.err)
	default:
	}
}

// Acceptance 1, network variant: the fault suite's network faults between
// outboxd and Kafka and between outboxd and Postgres.
func TestExactlyOnceNetworkFaults(t *testing.T) {
	d := newDB(t)
	pgProxy := newProxy(t, hostPort(t, d.dsn), false)
	kProxy := newProxy(t, svc.brokers[0], true)
	env := replace(eosEnv(d), "OUTBOXD_POSTGRES_DSN", strings.Replace(d.dsn, hostPort(t, d.dsn), pgProxy.Addr(), 1))
	env = replace(env, "OUTBOXD_KAFKA_BROKERS", kProxy.Addr())
	p := start(t, env)
	p.waitStreaming()
	spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 4,
		Events: pick(20000, 80000), TxSizes: []int{1, 10, 100, 3}, RollbackPct: 5, SavepointPct: 10, DeletePct: 20,
		Pace: 100 * time.Millisecond}
	f := startEOSRun(t, d, svc.brokers, spec)
	hold := pick(3*time.Second, 10*time.Second)
	rounds := pick(1, 3)
	n := injectNetworkFaults(t, f, pgProxy, kProxy, hold, rounds)
	r := f.finish("exactly-once: network faults", n, time.Now(),
		fmt.Sprintf("cut, stall, slow, refuse × Kafka and Postgres × %d; restarts %s", rounds, restarts(p)))
	noDuplicates(t, r)
	select {
	case <-p.done:
		t.Errorf("outboxd exited during network faults: %v", p.err)
	default:
	}
}

// Acceptance 2, idle: the active instance is paused with no Kafka
// transaction open, so Kafka refuses nothing of it when it resumes; it
// still finds out (the coordinator holds a newer epoch) and says so.
func TestExactlyOnceFencingIdle(t *testing.T) {
	d := newDB(t)
	env := eosEnv(d, "OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=200ms")
	a := start(t, env)
	a.waitStreaming()
	a.waitLog(`exactly-once: resuming`, 30*time.Second)
	b := start(t, env)
	b.waitLog(`msg="standby: another process holds the slot`, 30*time.Second)
	spec := loadSpec{Prefix: d.name, Types: 2, IDs: 10, Writers: 1, Events: 200, TxSizes: []int{1, 10}}
	f := startEOSRun(t, d, svc.brokers, spec)
	if err := <-f.loadDone; err != nil {
		t.Fatal(err)
	}
	f.loadDone <- nil
	f.c.waitFor(t, f.l.committedIDs(), time.Minute) // committed: no transaction open
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !regexp.MustCompile(`exactly-once: resuming`).MatchString(b.logs.String()) {
		if time.Now().After(deadline) {
			_ = a.cmd.Process.Signal(syscall.SIGCONT)
			t.Fatalf("the standby did not take over within 30s; log:\n%s", b.logs.String())
		}
		_, _ = d.pool.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active`, d.slot)
		time.Sleep(200 * time.Millisecond)
	}
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("A: %s", a.waitLog(`another outboxd took over: Kafka fenced transactional id[^\n]*`, 60*time.Second))
	a.waitLog(`msg="standby: another process holds the slot`, 60*time.Second)
	r := f.finish("exactly-once: fenced idle instance resumed", 1, time.Now(), "SIGSTOP with no Kafka transaction open")
	noDuplicates(t, r)
}

// Poison rows in exactly-once mode: a halt aborts the open Kafka
// transaction (the good row before the poison row in the same Postgres
// transaction is never seen by a read_committed consumer, and no
// transaction is left open to hold consumers back); with dlq after the
// restart every row, the dead letter included, is there once.
func TestExactlyOncePoisonHaltsThenDeadLetters(t *testing.T) {
	d := newDB(t)
	agg, dlq := d.name+"_ok", d.name+"_dlq"
	p := start(t, eosEnv(d))
	p.waitStreaming()
	c := collectCommitted(t, svc.brokers, []string{agg + "-events", dlq})
	before, _ := insertEvent(t, d, agg, "a-1", `{"n": 1}`)
	c.waitFor(t, []string{before}, time.Minute)
	good1, poison, good2 := uuid(), uuid(), uuid()
	ctx := context.Background()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range [][2]string{{good1, agg}, {poison, "bad topic"}, {good2, agg}} {
		if _, err := tx.Exec(ctx, insertSQL, row[0], row[1], "a-1", "Happened", `{"n": 2}`); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if code := p.waitExit(60 * time.Second); code != 1 {
		t.Fatalf("outboxd exited %d on a poison row, want 1", code)
	}
	id := regexp.MustCompile(`transactional_id=(\S+)`).FindStringSubmatch(p.logs.String())[1]
	txns, err := kadmOn(t, svc.brokers).DescribeTransactions(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st := txns[id].State; st == "Ongoing" {
		t.Errorf("the halt left transaction %s %s: read_committed consumers wait for its timeout", id, st)
	}
	time.Sleep(time.Second)
	if c.missing([]string{good1}) == 0 {
		t.Errorf("a read_committed consumer saw the row before the poison row of a halted transaction")
	}
	p = start(t, eosEnv(d, "OUTBOXD_ROUTER_POISON_POLICY=dlq", "OUTBOXD_ROUTER_POISON_DLQ_TOPIC="+dlq))
	p.waitStreaming()
	want := []string{before, good1, poison, good2}
	c.waitFor(t, want, time.Minute)
	time.Sleep(time.Second)
	n := map[string]int{}
	topic := map[string]string{}
	for _, r := range c.records() {
		n[header(r, "id")]++
		topic[header(r, "id")] = r.Topic
	}
	for _, id := range want {
		if n[id] != 1 {
			t.Errorf("event %s read %d times, want once", id, n[id])
		}
	}
	if topic[poison] != dlq {
		t.Errorf("the poison row went to %s, want %s", topic[poison], dlq)
	}
}

// A clean stop in exactly-once mode commits the open Kafka transaction at
// the transaction boundary the stream stops at, confirms it and exits 0;
// the restart repeats nothing.
func TestExactlyOnceSIGTERM(t *testing.T) {
	d := newDB(t)
	env := eosEnv(d, "OUTBOXD_SHUTDOWN_TIMEOUT=60s")
	p := start(t, env)
	p.waitStreaming()
	spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 4, Events: 12000, TxSizes: []int{1, 10, 50, 500},
		RollbackPct: 5, SavepointPct: 10, DeletePct: 20, Pace: 50 * time.Millisecond}
	f := startEOSRun(t, d, svc.brokers, spec)
	stops := 3
	for i := range stops {
		waitCommitted(t, f.l, (i+1)*spec.Events/(stops+1))
		if code := p.stop(syscall.SIGTERM, 90*time.Second); code != 0 {
			t.Fatalf("outboxd exited %d after SIGTERM, want 0", code)
		}
		if logs := p.logs.String(); !strings.Contains(logs, `msg=stopped`) || strings.Contains(logs, "shutdown_timeout") {
			t.Errorf("not a clean stop:\n%s", logs)
		}
		p = start(t, env)
		p.waitStreaming()
	}
	r := f.finish("exactly-once: SIGTERM and restart", stops, time.Now(), "")
	noDuplicates(t, r)
}

// Per-key order across an HA takeover in exactly-once mode (issue 32 item
// 10). The active instance A is cut off from Kafka (its produce requests
// held by a stalled proxy) while it decodes, then paused (SIGSTOP) with
// those records buffered; the standby B takes the slot and the
// transactional id, and delivers later events of the same keys; then A is
// resumed and its held requests reach the broker. At least once, those
// would land after B's records, an older event of a key after a newer one;
// exactly once, B's initialisation fenced A, so a read_committed consumer
// sees every key's events once, in commit order.
func TestExactlyOnceTakeoverKeepsKeyOrder(t *testing.T) {
	d := newDB(t)
	kProxy := newProxy(t, svc.brokers[0], true)
	env := eosEnv(d, "OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=200ms")
	a := start(t, replace(env, "OUTBOXD_KAFKA_BROKERS", kProxy.Addr()))
	a.waitStreaming()
	a.waitLog(`exactly-once: resuming`, 30*time.Second)
	b := start(t, env)
	b.waitLog(`msg="standby: another process holds the slot`, 30*time.Second)
	spec := loadSpec{Prefix: d.name, Types: 2, IDs: 8, Writers: 2, Events: 6000, TxSizes: []int{1, 5, 20}, RollbackPct: 5,
		Pace: 5 * time.Millisecond}
	f := startTakeover(t, d, spec, kProxy, a, b)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	kProxy.Resume() // A's held requests reach the broker
	t.Logf("A: %s", a.waitLog(`another outboxd took over: Kafka fenced transactional id[^\n]*`, 60*time.Second))
	r := f.finish("exactly-once: takeover from a paused instance with records buffered", 1, time.Now(),
		"A cut off from Kafka, SIGSTOP, B takes over, SIGCONT")
	noDuplicates(t, r)
	if n := regressions(f.l, f.c.records()); n > 0 {
		t.Errorf("a read_committed consumer saw %d records of a key after a later one of the same key", n)
	}
}

// startTakeover starts spec's load (read_committed collector) with a
// active and b standing by, lets a buffer records behind the stalled kProxy,
// pauses it (SIGSTOP, resumed at cleanup) and returns once b has taken over
// and delivered later events. The proxy stays stalled.
func startTakeover(t *testing.T, d *db, spec loadSpec, kProxy *faultProxy, a, b *proc) *faultRun {
	t.Helper()
	f := startEOSRun(t, d, svc.brokers, spec)
	waitCommitted(t, f.l, 300)
	f.c.waitFor(t, f.l.committedIDs()[:100], time.Minute)
	kProxy.Stall()
	waitCommitted(t, f.l, f.l.committedCount()+300)
	time.Sleep(300 * time.Millisecond) // A decodes them and hands them to its producer
	inFlight, _ := a.metric("outboxd_sink_records_in_flight")
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	t.Logf("A paused with %.0f records in flight at %d committed events", inFlight, f.l.committedCount())
	if inFlight == 0 {
		t.Errorf("A had no records in flight when paused: the test tests nothing")
	}
	deadline := time.Now().Add(30 * time.Second)
	for !regexp.MustCompile(`took over the slot from the previous holder`).MatchString(b.logs.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("the standby did not take over within 30s; log:\n%s", b.logs.String())
		}
		_, _ = d.pool.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active`, d.slot)
		time.Sleep(200 * time.Millisecond)
	}
	// B delivers what A held and later events of the same keys.
	after := f.l.committedCount() + 500
	waitCommitted(t, f.l, after)
	f.c.waitFor(t, f.l.committedIDs(), time.Minute)
	return f
}

// regressions counts the records a consumer reads after a record of the
// same key with a later sequence number: a key's state going back, for a
// consumer that applies events as they come. Duplicates of the key's last
// record are not counted.
func regressions(l *ledger, recs []*kgo.Record) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	top := map[string]int{}
	for _, rec := range inLogOrder(recs) {
		e, ok := l.committed[header(rec, "id")]
		if !ok {
			continue
		}
		k := rec.Topic + "/" + string(rec.Key)
		if e.Seq < top[k] {
			n++
		}
		top[k] = max(top[k], e.Seq)
	}
	return n
}
