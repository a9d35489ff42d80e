package test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// kafkaAheadRE is the line of a resumed exactly-once backfill that goes on
// after Kafka's cursor, which the cursor Postgres saved lagged.
var kafkaAheadRE = regexp.MustCompile(`exactly-once backfill: going on after the rows Kafka committed[^\n]*`)

// An exactly-once backfill (issue 35 §2) of 30,000 pending rows, with
// writers running, SIGKILLed three times during it, each time half a second
// after Postgres recorded a fifth more of the rows, so that Kafka has
// committed rows Postgres has not recorded yet. Each resumed run goes on
// after the cursor Kafka committed with the rows: a read_committed consumer
// sees every pending row and every later one exactly once, none lost, no
// SENT row, and each key in order across the backfill→stream switch.
func TestBackfillExactlyOnceSurvivesKills(t *testing.T) {
	const rows, batch, kills = 30000, 200, 3
	s := newBackfillSetup(t, rows, 200)
	c := collectCommitted(t, svc.brokers, []string{s.topic})
	stop := s.writing(t, 3)
	env := eosEnv(s.d)
	cfg := writeConfig(t, backfillConfig(batch, 5000))
	ahead := 0 // resumed runs that went on after Kafka's cursor, past Postgres's
	for k := range kills {
		p := start(t, env, "-config", cfg)
		if k > 0 {
			p.waitLog(`backfill started`, 30*time.Second)
			if line := kafkaAheadRE.FindString(p.logs.String()); line != "" {
				ahead++
				t.Log(line)
			}
		}
		s.waitRecorded(t, int64(k+1)*rows/5, fmt.Sprintf("kill %d", k+1))
		if k == 0 {
			showsProgress(t, p)
			if n, ok := p.metric("outboxd_sink_transactions_committed_total"); !ok || n <= 0 {
				t.Errorf("outboxd_sink_transactions_committed_total during the backfill: %v (found: %v); want its Kafka transactions", n, ok)
			}
		}
		// Half a second more: Kafka commits rows that Postgres, which
		// saves the cursor once a second, has not recorded.
		time.Sleep(500 * time.Millisecond)
		_, at, _ := s.progress(t)
		p.stop(syscall.SIGKILL, 10*time.Second)
		t.Logf("kill %d at %d rows recorded in Postgres", k+1, at)
		if k == 0 {
			s.cleanUp(t)
		}
	}
	p := start(t, env, "-config", cfg)
	p.waitStreaming()
	if line := kafkaAheadRE.FindString(p.logs.String()); line != "" {
		ahead++
		t.Log(line)
	}
	t.Log(p.waitLog(`msg="backfill done[^"]*"[^\n]*`, time.Second))
	time.Sleep(time.Second) // the writers go on; outboxd streams
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, s.l.committedIDs(), 2*time.Minute)
	time.Sleep(2 * time.Second) // for duplicates
	r := check(s.l, c.records(), partitionsOf(t, s.topic))
	t.Logf("%s", r)
	r.failOnLoss(t)
	noDuplicates(t, r)
	if ahead == 0 {
		t.Errorf("no resumed run went on after a cursor Kafka committed past the one Postgres recorded: the kills did not test the window they are for")
	}
	if phase, sent, total := s.progress(t); phase != "done" || sent != total {
		t.Errorf("backfill state: phase %s, %d of %d rows sent; want done, all", phase, sent, total)
	}
}

// writing starts writers writers (write) and returns what stops them and
// returns their error.
func (s *backfillSetup) writing(t *testing.T, writers int) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	halt := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- s.write(ctx, halt, writers) }()
	return func() error {
		close(halt)
		return <-done
	}
}

// cleanUp is the application cleaning up while outboxd is down: it deletes
// 2,000 pending rows and flips 2,000 others to SENT. The backfill sends each
// as the slot's snapshot saw it, as the stream would.
func (s *backfillSetup) cleanUp(t *testing.T) {
	t.Helper()
	s.d.exec(t, `DELETE FROM public.relay_outbox WHERE id IN (SELECT id FROM public.relay_outbox
		WHERE status IN ('PENDING','PROCESSING') ORDER BY created_at DESC LIMIT 2000)`)
	s.d.exec(t, `UPDATE public.relay_outbox SET status = 'SENT', retry_count = retry_count + 1 WHERE id IN (SELECT id FROM public.relay_outbox
		WHERE status IN ('PENDING','PROCESSING') ORDER BY created_at DESC LIMIT 2000)`)
}

// showsProgress checks that p, backfilling, shows its progress in /status
// and the metrics.
func showsProgress(t *testing.T, p *proc) {
	t.Helper()
	p.addr = listenRE.FindStringSubmatch(p.waitLog(`msg="serving metrics and health" addr=\S+`, time.Second))[1]
	if _, body := p.get("/status"); !strings.Contains(body, "backfilling the rows already in the table") {
		t.Errorf("/status during the backfill: %s; want its progress", body)
	}
	if left, ok := p.metric("outboxd_backfill_rows_remaining"); !ok || left <= 0 {
		t.Errorf("outboxd_backfill_rows_remaining during the backfill: %v (found: %v); want the rows left", left, ok)
	}
}

// waitRecorded waits until the backfill, under way, recorded want rows
// sent in Postgres, before what (for the messages), and returns how many it
// recorded.
func (s *backfillSetup) waitRecorded(t *testing.T, want int64, what string) int64 {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		phase, sent, _ := s.progress(t)
		if phase == "done" {
			t.Fatalf("the backfill finished before %s (at %d rows recorded); raise the rows or lower postgres.backfill.rate", what, sent)
		}
		if phase == "sending" && sent >= want {
			return sent
		}
		if time.Now().After(deadline) {
			t.Fatalf("the backfill recorded %d rows in 60 s, want %d before %s", sent, want, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An exactly-once backfill's instance A is cut off from Kafka with a Kafka
// transaction open (its requests held by a proxy), paused (SIGSTOP) and
// its Postgres session ended, as a partition would: B takes the backfill
// over, its producer's initialisation fences A and aborts A's transaction,
// and B goes on after the cursor Kafka committed. When A resumes and its
// held requests reach the broker, they are refused: a read_committed
// consumer sees every row once, each key in order.
func TestBackfillExactlyOnceFencesAZombie(t *testing.T) {
	const rows = 20000
	s := newBackfillSetup(t, rows, 40)
	c := collectCommitted(t, svc.brokers, []string{s.topic})
	stop := s.writing(t, 2)
	kProxy := newProxy(t, svc.brokers[0], true)
	env := eosEnv(s.d, "OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=200ms")
	cfg := writeConfig(t, backfillConfig(200, 4000))
	a := start(t, replace(env, "OUTBOXD_KAFKA_BROKERS", kProxy.Addr()), "-config", cfg)
	s.waitRecorded(t, rows/5, "A is cut off")
	kProxy.Stall()
	time.Sleep(300 * time.Millisecond) // A hands the next page to its producer, in a transaction
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	_, at, _ := s.progress(t)
	t.Logf("A paused at %d rows recorded", at)
	// A's session ends (a partition, tcp_keepalives): its backfill lock goes.
	s.d.exec(t, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	b := start(t, env, "-config", cfg)
	t.Log(b.waitLog(`backfill started[^\n]*`, 30*time.Second))
	t.Log(b.waitLog(`msg="backfill done[^"]*"[^\n]*`, 60*time.Second))
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	kProxy.Resume() // A's held requests reach the broker
	fenced := regexp.MustCompile(`another outboxd took over: Kafka fenced transactional id[^\n]*`)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if line := fenced.FindString(a.logs.String()); line != "" {
			t.Logf("A: %s", line)
			break
		}
		if time.Now().After(deadline) {
			t.Error("A, resumed, did not say that it was fenced within 30 s")
			break
		}
	}
	time.Sleep(time.Second) // the writers go on; B streams
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, s.l.committedIDs(), 2*time.Minute)
	time.Sleep(2 * time.Second) // for duplicates
	recs := c.records()
	r := check(s.l, recs, partitionsOf(t, s.topic))
	t.Logf("%s", r)
	r.failOnLoss(t)
	noDuplicates(t, r)
	if n := regressions(s.l, recs); n > 0 {
		t.Errorf("a read_committed consumer saw %d records of a key after a later one of the same key", n)
	}
}
