package test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/wal"
)

// Exactly-once mode across a promotion of a standby that had not received
// everything: the position in Kafka (written on timeline 1) lies past the
// point where the promoted standby's timeline 2 began. The events between
// the two are in Kafka but not on the new primary; the new primary's own
// transactions after the switch point must still be delivered, not skipped
// as if the position covered them.
func TestExactlyOnceAfterPromotionOfALaggingStandby(t *testing.T) {
	primary := startOwnPostgres(t)
	pair := addStandby(t, primary)
	d := outboxDB(t, pair.dsn)
	topic := d.name + "-events"
	c := collectCommitted(t, svc.brokers, []string{topic})
	p := start(t, eosEnv(d))
	p.waitStreaming()
	first := uuid()
	d.exec(t, insertSQL, first, d.name, "k", "Happened", `{}`)
	c.waitFor(t, []string{first}, time.Minute)

	// The standby stops receiving; the primary goes on, by about 2 MB of WAL
	// in one transaction, all of it delivered and its position committed.
	pair.standby.script("pg-stop")
	var ahead []string
	ctx := context.Background()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	payload := fmt.Sprintf(`{"pad": "%s"}`, strings.Repeat("x", 20000))
	for range 100 {
		id := uuid()
		ahead = append(ahead, id)
		if _, err := tx.Exec(ctx, insertSQL, id, d.name, "k", "Happened", payload); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, ahead, time.Minute)
	p.stop(syscall.SIGTERM, 30*time.Second)
	pair.kill()

	// The standby comes back and is promoted without those 100 events; the
	// operator creates the slot there (there was no failover slot).
	pair.standby.script("pg-start")
	pair.promote()
	promoted, err := pgx.Connect(ctx, pair.standby.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer promoted.Close(ctx)
	deadline := time.Now().Add(time.Minute)
	for {
		var recovery bool
		if err := promoted.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&recovery); err == nil && !recovery {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the standby is still in recovery a minute after pg_ctl promote")
		}
		time.Sleep(100 * time.Millisecond)
	}
	var n int
	if err := promoted.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = ANY($1)`, ahead).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the promoted standby has %d of the 100 events written after it stopped (%v); want none", n, err)
	}
	if _, err := wal.CreateSlot(ctx, promoted, d.slot, false); err != nil {
		t.Fatal(err)
	}
	var after []string
	for range 3 {
		id := uuid()
		after = append(after, id)
		if _, err := promoted.Exec(ctx, insertSQL, id, d.name, "k", "Happened", `{}`); err != nil {
			t.Fatal(err)
		}
	}

	q := start(t, eosEnv(d, "OUTBOXD_POSTGRES_CREATE_SLOT=false"))
	c.waitFor(t, after, time.Minute)
	q.waitLog(`exactly-once: the position in Kafka lies past where this server's timeline began`, time.Second)
}

// A position in Kafka past the server's WAL (a database restored from a
// backup that kept its system identifier, or another server's position under
// the same transactional id) is refused: applying it would skip everything
// the server commits up to it, and confirm the slot past WAL that does not
// exist yet.
func TestExactlyOncePositionPastTheWALIsRefused(t *testing.T) {
	d := newDB(t)
	tid := d.name + "-tid"
	positions := d.name + "-positions"
	cl := kafkaClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	compact := "compact"
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": &compact}, positions); err != nil {
		t.Fatal(err)
	}
	rec := &kgo.Record{Topic: positions, Key: []byte(tid), Value: []byte(`{"lsn":"FF/0","slot":"` + d.slot + `","at":"2026-01-01T00:00:00Z"}`)}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	p := start(t, eosEnv(d, "OUTBOXD_KAFKA_TRANSACTIONAL_ID="+tid))
	p.waitLog(`is past this server's WAL \([^)]+\): the database was restored from a backup`, time.Minute)
	if lsn := d.confirmedFlush(t); lsn >= 0xFF_0000_0000 {
		t.Errorf("the slot was confirmed to %X, past the server's WAL", lsn)
	}
}

// Two deployments on one Postgres cluster, on different slots, given the
// same kafka.transactional_id (issue 32 item 2). The second one to start
// finds the first's position; it must refuse it, naming both slots, and
// stop without confirming anything on its own slot (applying it would skip
// its own events up to the other slot's LSN), and without fencing the first
// (it looks before it initialises the id). The second, given its own id,
// then delivers everything: nothing lost on either, nothing twice.
func TestExactlyOnceSharedTransactionalIDIsRefused(t *testing.T) {
	dA, dB := newDB(t), newDB(t)
	shared := dA.name + "-shared"
	positions := "OUTBOXD_KAFKA_POSITIONS_TOPIC=" + dA.name + "-positions"
	envA := eosEnv(dA, positions, "OUTBOXD_KAFKA_TRANSACTIONAL_ID="+shared, "OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=200ms")
	envB := func(id string) []string { return eosEnv(dB, positions, "OUTBOXD_KAFKA_TRANSACTIONAL_ID="+id) }
	// B's slot exists first (its load must be in it), made by a run with
	// an id of its own.
	b := start(t, envB(dB.name+"-own"))
	b.waitStreaming()
	b.stop(syscall.SIGTERM, 30*time.Second)
	bConfirmed := dB.confirmedFlush(t)

	a := start(t, envA)
	a.waitStreaming()
	spec := func(d *db) loadSpec {
		return loadSpec{Prefix: d.name, Types: 2, IDs: 20, Writers: 2, Events: 3000, TxSizes: []int{1, 10, 50}, RollbackPct: 5,
			Pace: 20 * time.Millisecond}
	}
	fa := startEOSRun(t, dA, svc.brokers, spec(dA))
	fb := startEOSRun(t, dB, svc.brokers, spec(dB))
	waitCommitted(t, fa.l, 500)
	waitCommitted(t, fb.l, 500)
	fa.c.waitFor(t, fa.l.committedIDs()[:100], time.Minute) // A has committed positions

	b = start(t, envB(shared))
	select {
	case <-b.done:
		if code := b.cmd.ProcessState.ExitCode(); code != 1 {
			t.Errorf("B exited %d, want 1", code)
		}
		t.Logf("B: %s", b.waitLog(`the position of transactional id[^\n]*`, time.Second))
		b.waitLog(`was written for slot \\?"`+dA.slot+`\\?", and this outboxd streams slot \\?"`+dB.slot+`\\?"`, time.Second)
		b.waitLog(`Give each deployment its own kafka.transactional_id`, time.Second)
	case <-time.After(30 * time.Second):
		t.Errorf("B, sharing A's transactional id, still runs after 30 s; log:\n%s", b.logs.String())
		b.kill()
	}
	if lsn := dB.confirmedFlush(t); lsn != bConfirmed && !t.Failed() {
		t.Errorf("B's slot was confirmed from %X to %X by the run that refused the position", bConfirmed, lsn)
	}
	if strings.Contains(a.logs.String(), "another outboxd took over") {
		t.Errorf("B fenced A before refusing A's position")
	}

	// The operator gives B its own id.
	b = start(t, envB(dB.name+"-own"))
	b.waitStreaming()
	ra := fa.finish("exactly-once: shared transactional id, first deployment", 1, time.Now(), "the second refused its position without fencing it")
	rb := fb.finish("exactly-once: shared transactional id, second deployment", 1, time.Now(), "refused the first's position, restarted with its own id")
	noDuplicates(t, ra)
	noDuplicates(t, rb)
	select {
	case <-a.done:
		t.Errorf("A exited (%v) after the fence", a.err)
	default:
	}
}
