package test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Issue 35 section 3: outboxd replay beside a running outboxd delivering
// live load. A range written before is replayed, the replay is SIGKILLed
// mid-way and resumed. The replayed records are exactly the rows still in
// the table that match the WHERE (rows deleted since are not), routed and
// partitioned as the daemon routes them, each key's in the table's order,
// each marked with outboxd.replay; the resumed run repeats at most the page
// in flight; and the live load is delivered whole meanwhile.
func TestReplayBesideLiveDelivery(t *testing.T) {
	d := newDB(t)
	// An order column that grows with every row, so that the rows of one
	// transaction keep their insert order (created_at is the
	// transaction's start).
	d.exec(t, `ALTER TABLE outbox ADD COLUMN n bigint GENERATED ALWAYS AS IDENTITY`)
	daemon := start(t, d.env())
	daemon.waitStreaming()

	// The range to replay, written (and delivered) before the replay.
	past := newLedger()
	spec := loadSpec{Prefix: d.name + "_old", Types: 3, IDs: 40, Writers: 4, Events: 4000, TxSizes: []int{1, 5, 20}, RollbackPct: 5, DeletePct: 10}
	if err := runLoad(context.Background(), d, spec, past); err != nil {
		t.Fatal(err)
	}
	// A clause Postgres refuses, or one that would write, stops the replay
	// before anything is sent, saying what to fix (the clause is
	// evaluated on the rows written above).
	for clause, want := range map[string]string{
		"nosuch > 1":                  `refused by Postgres at character 1 of it: column "nosuch" does not exist \(SQLSTATE 42703\); fix the clause`,
		"nextval('outbox_n_seq') > 0": `writes \(cannot execute nextval\(\) in a read-only transaction\)`,
	} {
		bad := start(t, d.env(), "replay", "-where", clause)
		if code := bad.waitExit(30 * time.Second); code != 1 {
			t.Fatalf("replay -where %q exited %d, want 1:\n%s", clause, code, bad.logs.String())
		}
		bad.waitLog(want, time.Second)
	}

	// The live events' commit-to-ack latency before and during the replay,
	// logged (never asserted: the machine is shared).
	// The window before starts once the range written above is delivered.
	ackLatency := "outboxd_sink_commit_to_ack_seconds"
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if n, _ := daemon.metric(ackLatency + "_count"); int(n) >= len(past.committed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("outboxd did not deliver the %d events written before the replay within a minute", len(past.committed))
		}
	}

	// The live load runs beside the replay, on other topics: at least 7.5 s
	// (750 transactions a writer, 10 ms apart), longer than the replay.
	live := newLedger()
	liveDone := make(chan error, 1)
	go func() {
		liveDone <- runLoad(context.Background(), d, loadSpec{Prefix: d.name + "_new", Types: 3, IDs: 40, Writers: 2, Events: 3000,
			TxSizes: []int{1, 3}, RollbackPct: 5, Pace: 10 * time.Millisecond}, live)
	}()
	// The window before the replay starts once the live topics exist (the
	// first events wait for their creation).
	waitCommitted(t, live, 200)
	liveStart := buckets(t, daemon, ackLatency)
	waitCommitted(t, live, 600)
	replayStart := buckets(t, daemon, ackLatency)

	where := fmt.Sprintf("aggregate_type LIKE '%s\\_old\\_%%'", d.name)
	const batch = 200
	args := []string{"replay", "-where", where, "-order", "n", "-rate", "2000", "-batch", fmt.Sprint(batch), "-progress", "500ms"}
	replay := start(t, d.env(), args...)
	run := regexp.MustCompile(`replay (\S+) started`).FindStringSubmatch(replay.waitLog(`replay \S+ started`, 30*time.Second))[1]
	t.Logf("replay run %s", run)

	// SIGKILL once a third of the rows are recorded as sent.
	// outboxd_replay is where the run records its progress (-state-table).
	var want int
	if err := d.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE `+where).Scan(&want); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for sent := 0; sent < want/3; {
		if time.Now().After(deadline) {
			t.Fatalf("the replay recorded %d of %d rows as sent within 30 s", sent, want)
		}
		var raw []byte
		err := d.pool.QueryRow(context.Background(), `SELECT state::text FROM outboxd_replay WHERE run_id = $1`, run).Scan(&raw)
		if err == nil {
			var st struct{ Sent int }
			if err := json.Unmarshal(raw, &st); err != nil {
				t.Fatal(err)
			}
			sent = st.Sent
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Into the next page, so that records are in flight (a page takes
	// 100 ms at 2,000 records/s); the checks hold wherever the kill lands.
	time.Sleep(50 * time.Millisecond)
	replay.stop(syscall.SIGKILL, 10*time.Second)
	t.Logf("killed the replay; resuming it")

	resumed := start(t, d.env(), "replay", "-resume", run, "-progress", "500ms")
	if code := resumed.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("the resumed replay exited %d:\n%s", code, resumed.logs.String())
	}
	resumed.waitLog(`replay `+regexp.QuoteMeta(run)+` of public.outbox finished: \d+ rows sent`, time.Second)
	t.Logf("resumed replay: %s", regexp.MustCompile(`msg="replay ended".*`).FindString(resumed.logs.String()))

	// The live load, delivered whole by the daemon meanwhile.
	t.Logf("live events committed when the replay ended: %d; their commit-to-ack p99 (histogram bucket) before the replay: %s, during it: %s",
		live.committedCount(), p99(liveStart, replayStart), p99(replayStart, buckets(t, daemon, ackLatency)))
	verifyLoad(t, live, liveDone)

	// The rows the replay had to send: those still in the table that match.
	expect := newLedger()
	rows, err := d.pool.Query(context.Background(), `SELECT id::text FROM outbox WHERE `+where)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		e, ok := past.committed[id]
		if !ok {
			t.Fatalf("row %s matches the WHERE but was never committed by the load", id)
		}
		expect.add(true, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	deleted := len(past.committed) - len(expect.committed)
	if deleted == 0 {
		t.Fatal("the load deleted no row: the test would not show that deleted rows are not replayed")
	}
	replayed := func(recs []*kgo.Record) []*kgo.Record {
		var out []*kgo.Record
		for _, rec := range recs {
			if v := header(rec, "outboxd.replay"); v != "" {
				if v != run {
					t.Fatalf("record %s carries outboxd.replay %q, want the run's id %q", header(rec, "id"), v, run)
				}
				out = append(out, rec)
			}
		}
		return out
	}
	all := readUntil(t, past.topics(), time.Minute, 2*time.Second, func(recs []*kgo.Record) bool {
		return allDelivered(expect)(replayed(recs))
	})
	recs := replayed(all)
	rep := check(expect, recs, partitionsOf(t, past.topics()...))
	t.Logf("replay: %s (%d rows matched, %d deleted since they were written; %d records in the topics in all)", rep, len(expect.committed), deleted, len(all))
	rep.failOnLoss(t)
	if rep.Duplicates > batch {
		t.Errorf("the resumed replay sent %d rows again, more than the %d of the page in flight", rep.Duplicates, batch)
	}
}

// buckets returns the cumulative bucket counts of an unlabelled histogram
// of p's, by upper bound.
func buckets(t *testing.T, p *proc, name string) map[float64]uint64 {
	t.Helper()
	mfs, ok := p.scrape()
	if !ok || mfs[name] == nil || len(mfs[name].GetMetric()) != 1 {
		t.Fatalf("outboxd exports no histogram %s", name)
	}
	out := map[float64]uint64{}
	for _, b := range mfs[name].GetMetric()[0].GetHistogram().GetBucket() {
		out[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	return out
}

// p99 returns the upper bound of the bucket that holds the 99th percentile
// of the observations between two readings of a histogram.
func p99(from, to map[float64]uint64) string {
	bounds := slices.Sorted(maps.Keys(to))
	if len(bounds) == 0 {
		return "none"
	}
	total := to[bounds[len(bounds)-1]] - from[bounds[len(bounds)-1]]
	if total == 0 {
		return "no events"
	}
	for _, b := range bounds {
		if float64(to[b]-from[b]) >= 0.99*float64(total) {
			return fmt.Sprintf("<= %gs of %d events", b, total)
		}
	}
	return fmt.Sprintf("> %gs of %d events", bounds[len(bounds)-1], total)
}
