package relay

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/kfaketest"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

func TestPositionRoundTrip(t *testing.T) {
	for _, p := range []position{
		{LSN: 0x16B3748, Slot: "outboxd"},
		{LSN: 0x1_0000_0010, Txn: 0x1_0000_2000, Rows: 1234, Slot: "outboxd_1of4", System: "7441234567890123456"},
		{LSN: 0x20, Timeline: 3, Slot: "outboxd"},
		{},
	} {
		got, err := decodePosition(p.encode())
		if err != nil || got != p {
			t.Errorf("decode(encode(%+v)) = %+v, %v", p, got, err)
		}
	}
	for _, bad := range []string{`not json`, `{"lsn": "xyz"}`, `{"lsn": "0/10", "txn": "?"}`} {
		if _, err := decodePosition([]byte(bad)); err == nil {
			t.Errorf("decodePosition(%s) accepted it", bad)
		}
	}
	if p, _ := decodePosition([]byte(`{"lsn":"0/20","slot":"s","at":"x"}`)); p != (position{LSN: 0x20, Slot: "s"}) {
		t.Errorf("a position without a system identifier decoded as %+v", p)
	}
}

// A position is applied only by the slot and database it was written for:
// two deployments given one kafka.transactional_id must not skip each
// other's events (issue 32 item 2). Shards and reshards are not refused:
// each shard's slot and id differ, so its position names its own slot; a
// position without a system identifier (an older outboxd's) is judged by
// its slot.
func TestOwnPosition(t *testing.T) {
	const sys, other = "7441234567890123456", "7449999999999999999"
	for _, c := range []struct {
		name string
		pos  position
		slot string
		err  string
	}{
		{name: "this slot", pos: position{LSN: 0x100, Slot: "outboxd", System: sys}, slot: "outboxd"},
		{name: "this slot, no system identifier", pos: position{LSN: 0x100, Slot: "outboxd"}, slot: "outboxd"},
		{name: "this shard", pos: position{LSN: 0x100, Slot: "outboxd_1of4", System: sys}, slot: "outboxd_1of4"},
		{name: "another slot", pos: position{LSN: 0x100, Slot: "billing", System: sys}, slot: "orders",
			err: `the position of transactional id "shared" in outboxd-positions (LSN 0/100) was written for slot "billing", and this outboxd streams slot "orders": ` +
				`another deployment uses the same kafka.transactional_id`},
		{name: "another shard", pos: position{LSN: 0x100, Slot: "outboxd_0of4", System: sys}, slot: "outboxd_1of4",
			err: `written for slot "outboxd_0of4", and this outboxd streams slot "outboxd_1of4"`},
		{name: "another shard count", pos: position{LSN: 0x100, Slot: "outboxd_0of2", System: sys}, slot: "outboxd_0of4",
			err: `written for slot "outboxd_0of2"`},
		{name: "no slot named", pos: position{LSN: 0x100}, slot: "outboxd", err: `written for slot ""`},
		{name: "another database", pos: position{LSN: 0x100, Slot: "outboxd", System: other}, slot: "outboxd",
			err: `written for slot "outboxd" of the database with system identifier 7449999999999999999 (this one's is 7441234567890123456)`},
		{name: "another slot and database", pos: position{LSN: 0x100, Slot: "billing", System: other}, slot: "orders",
			err: `written for slot "billing" of the database with system identifier 7449999999999999999, and this outboxd streams slot "orders"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := ownPosition(c.pos, c.slot, sys, "shared", "outboxd-positions")
			if (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
				t.Fatalf("ownPosition(%+v, %q) = %v; want %q", c.pos, c.slot, err, c.err)
			}
			if err != nil {
				if !IsPermanent(err) {
					t.Errorf("IsPermanent(%v) = false: the run would restart and fence the other deployment again", err)
				}
				if msg := err.Error(); !strings.Contains(msg, "Give each deployment its own kafka.transactional_id") {
					t.Errorf("the refusal does not say what to do: %s", msg)
				}
			}
		})
	}
}

// A position written on this server's timeline, or of unknown timeline, and
// within its WAL is taken as it is; one from an earlier timeline is checked
// against the timeline's history; one from a later timeline (an old primary)
// or past the server's WAL (a restored backup) is refused.
func TestCheckPosition(t *testing.T) {
	for _, c := range []struct {
		pos     position
		history bool
		err     string
	}{
		{pos: position{LSN: 0x100, Timeline: 2}},
		{pos: position{LSN: 0x100}},
		{pos: position{LSN: 0x100, Timeline: 1}, history: true},
		{pos: position{LSN: 0x100, Timeline: 3}, err: "this server is on timeline 2: it is an old primary"},
		{pos: position{LSN: 0x2000, Timeline: 2}, err: "(LSN 0/2000) is past this server's WAL (0/1000): the database was restored from a backup"},
		{pos: position{LSN: 0x2000}, err: "is past this server's WAL"},
	} {
		history, err := checkPosition(c.pos, 2, 0x1000, "outboxd-positions")
		if history != c.history || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("checkPosition(%+v) on timeline 2, WAL at 0/1000 = %v, %v; want %v, %q", c.pos, history, err, c.history, c.err)
		}
	}
}

// A position from an earlier timeline is moved back to the switch point
// when it lies past it, and keeps a split-transaction marker only for a
// transaction that committed before the switch point: one that commits at
// or after it on the new timeline is another transaction, and must not lose
// its first rows (issue 32 item 4). A dropped marker is reported (dropped),
// for a warning naming it (review of the exactly-once changes, finding 6).
func TestRewind(t *testing.T) {
	const end = wal.LSN(0x1000)
	for _, c := range []struct {
		name           string
		pos            position
		want           position
		moved, dropped bool
	}{
		{"before the switch point", position{LSN: 0x800, Timeline: 1}, position{LSN: 0x800, Timeline: 1}, false, false},
		{"split transaction committed before it", position{LSN: 0x800, Txn: 0x900, Rows: 7, Timeline: 1},
			position{LSN: 0x800, Txn: 0x900, Rows: 7, Timeline: 1}, false, false},
		{"split transaction committing at it", position{LSN: 0x800, Txn: end, Rows: 7, Timeline: 1}, position{LSN: 0x800, Timeline: 1}, false, true},
		{"split transaction committing after it", position{LSN: 0x800, Txn: 0x1200, Rows: 7, Timeline: 1}, position{LSN: 0x800, Timeline: 1}, false, true},
		{"at the switch point, split after it", position{LSN: end, Txn: 0x1100, Rows: 3, Timeline: 1}, position{LSN: end, Timeline: 1}, false, true},
		{"past the switch point", position{LSN: 0x2000, Timeline: 1}, position{LSN: end, Timeline: 2}, true, false},
		{"past it, split", position{LSN: 0x2000, Txn: 0x2100, Rows: 5, Timeline: 1}, position{LSN: end, Timeline: 2}, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, moved, dropped := rewind(c.pos, end, 2)
			if got != c.want || moved != c.moved || dropped != c.dropped {
				t.Errorf("rewind(%+v, %s, 2) = %+v, moved %v, dropped %v; want %+v, %v, %v", c.pos, end, got, moved, dropped, c.want, c.moved, c.dropped)
			}
		})
	}
}

// A Kafka transaction commits at a Postgres transaction boundary at once
// when no complete Postgres transaction waits behind it (a quiet stream),
// and under load only once it is transaction_interval old or holds
// max_buffered_records records (issue 36 section 2).
func TestCommitDue(t *testing.T) {
	k := config.Default().Kafka
	k.TransactionInterval, k.MaxBufferedRecords = 100*time.Millisecond, 1000
	for _, c := range []struct {
		name    string
		records int
		age     time.Duration
		waiting bool
		want    bool
	}{
		{"quiet: one record, just opened", 1, 0, false, true},
		{"quiet: old and full", 1000, time.Second, false, true},
		{"load: young and small", 10, 5 * time.Millisecond, true, false},
		{"load: just under the interval", 999, 99 * time.Millisecond, true, false},
		{"load: the interval", 10, 100 * time.Millisecond, true, true},
		{"load: full", 1000, time.Millisecond, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := commitDue(c.records, c.age, c.waiting, k); got != c.want {
				t.Errorf("commitDue(%d records, %s old, waiting %v) = %v, want %v", c.records, c.age, c.waiting, got, c.want)
			}
		})
	}
}

// A complete transaction waits behind a Commit when a later Commit is in
// its batch.
func TestLastCommit(t *testing.T) {
	b, c := &wal.Begin{}, &wal.Commit{}
	for _, tc := range []struct {
		batch []wal.Item
		want  int
	}{
		{nil, -1},
		{[]wal.Item{b}, -1},
		{[]wal.Item{b, c}, 1},
		{[]wal.Item{b, c, b, c, b}, 3},
	} {
		if got := lastCommit(tc.batch); got != tc.want {
			t.Errorf("lastCommit(%d items) = %d, want %d", len(tc.batch), got, tc.want)
		}
	}
}

// eosRig is a Relay in exactly-once mode on a kfake cluster, whose
// postgres.dsn points at a listener that counts the connections made to it
// (and closes them: it is no Postgres).
type eosRig struct {
	r      *Relay
	c      *kfake.Cluster
	dials  *atomic.Int64
	system string
}

func newEOSRig(t *testing.T, deliveryTimeout time.Duration) *eosRig {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, config.Default().Kafka.PositionsTopic, "order-events"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var dials atomic.Int64
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			conn.Close()
		}
	}()
	cfg := config.Default()
	cfg.Postgres.DSN = "postgres://outboxd@" + ln.Addr().String() + "/outboxd?connect_timeout=2"
	cfg.Kafka.Brokers = c.ListenAddrs()
	cfg.Kafka.Delivery = config.ExactlyOnce
	cfg.Kafka.TopicPartitions, cfg.Kafka.TopicReplicationFactor = 1, 1
	cfg.Kafka.DeliveryTimeout = deliveryTimeout
	r, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	const system = "7441234567890123456"
	r.system = system // what producerFor read on the run's connection
	return &eosRig{r: r, c: c, dials: &dials, system: system}
}

// pipeline returns a pipeline on a transactional producer of id, and its
// context.
func (g *eosRig) pipeline(t *testing.T, ctx context.Context, id string) (*Pipeline, *sink.Producer, context.Context) {
	t.Helper()
	producer, err := sink.NewTransactional(g.r.cfg.Kafka, g.r.sinkM, g.r.txnM, g.r.log, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producer.Close)
	run, fail := context.WithCancelCause(ctx)
	t.Cleanup(func() { fail(nil) })
	p := g.r.NewPipeline(run, checkpoint.New(0x100), producer, fail, 0)
	t.Cleanup(p.Close)
	return p, producer, run
}

// start runs startEOS with a transactional producer of id.
func (g *eosRig) start(t *testing.T, ctx context.Context, id string) (*eos, error) {
	t.Helper()
	p, producer, run := g.pipeline(t, ctx, id)
	return g.r.startEOS(run, p, producer)
}

// otherHolder initialises id on c as another producer would, and leaves a
// transaction open holding a position record of value pos.
func otherHolder(t *testing.T, ctx context.Context, c *kfake.Cluster, id string, pos []byte) *kgo.Client {
	t.Helper()
	other, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID(id),
		kgo.DefaultProduceTopic(config.Default().Kafka.PositionsTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	if err := other.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := other.ProduceSync(ctx, &kgo.Record{Key: []byte(id), Value: pos}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return other
}

// While the positions partition cannot be read for longer than
// kafka.delivery_timeout, a run's start fails before Init: the id's holder,
// with its transaction open, is not fenced and commits it (review of the
// exactly-once changes, finding 3). And the Kafka calls hold no
// replication connection: startEOS dials Postgres only after them, so a
// start blocked on Kafka does not keep a second walsender (finding 2).
func TestStartEOSUnreadablePositions(t *testing.T) {
	g := newEOSRig(t, 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const id = "outboxd-shared"
	pos := position{LSN: 0x200, Slot: g.r.cfg.Postgres.Slot, System: g.system}.encode()
	other := otherHolder(t, ctx, g.c, id, pos)
	failed := kfaketest.FailFetches(g.c, g.r.cfg.Kafka.PositionsTopic, time.Hour) // for longer than the test
	began := time.Now()
	_, err := g.start(t, ctx, id)
	t.Logf("startEOS = %v after %s, %d fetches failed, %d connections to Postgres", err, time.Since(began).Round(time.Millisecond), failed.Load(), g.dials.Load())
	if failed.Load() == 0 {
		t.Fatal("no fetch of the positions topic failed: the test tests nothing")
	}
	if err == nil {
		t.Fatal("startEOS succeeded with the positions partition unreadable; want an error before Init")
	}
	if n := g.dials.Load(); n != 0 {
		t.Errorf("startEOS opened %d Postgres connections while it waited on Kafka; want none before the position is read", n)
	}
	if err := other.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Errorf("the id's other holder cannot commit its open transaction: startEOS fenced it: %v", err)
	}
}

// A position another deployment wrote under the same id and that was
// aborted (its writer fenced) decides nothing: the peek passes over it, and
// this slot's committed position starts the run. One still open, or
// committed, is refused as before (review of the exactly-once changes,
// finding 4).
func TestStartEOSPeekPassesOverAborted(t *testing.T) {
	abort, commit := kgo.TryAbort, kgo.TryCommit
	for _, c := range []struct {
		name    string
		end     *kgo.TransactionEndTry // of the other deployment's transaction; nil: left open
		refused bool
	}{
		{"aborted", &abort, false},
		{"open", nil, true},
		{"committed", &commit, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newEOSRig(t, 5*time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			const id = "outboxd-shared"
			slot := g.r.cfg.Postgres.Slot
			ours := otherHolder(t, ctx, g.c, id, position{Slot: slot, System: g.system}.encode())
			if err := ours.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
			theirs := otherHolder(t, ctx, g.c, id, position{LSN: 0x500, Slot: "billing", System: g.system}.encode())
			if c.end != nil {
				if err := theirs.EndTransaction(ctx, *c.end); err != nil {
					t.Fatal(err)
				}
			}
			_, err := g.start(t, ctx, id)
			var refused *refusedError
			if errors.As(err, &refused) != c.refused || (!c.refused && err != nil) {
				t.Errorf("startEOS after the other deployment's position was %s = %v; want refused %v", c.name, err, c.refused)
			}
		})
	}
}

// A completed Postgres transaction is visible to read_committed consumers
// at once when the boundary after it saw a batch queued that holds only the
// next transaction's Begin and first rows: a Begin is a boundary too, and
// with no complete transaction waiting behind it the Kafka transaction
// commits there, whole (issue 36 section 2's quiet-stream rule). Without
// it, T1 waited for T2's end or the split for age (half the delivery
// timeout, here 10 s) (review of the exactly-once changes, finding 7).
func TestPipeEOSBeginIsABoundary(t *testing.T) {
	g := newEOSRig(t, 20*time.Second)
	g.r.cfg.Kafka.TransactionInterval = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, producer, run := g.pipeline(t, ctx, "outboxd-linger")
	// T2's batch is queued when T1's Commit is handled: "waiting".
	batches := make(chan []wal.Item, 2)
	batches <- []wal.Item{begin(0x200), change(wal.Insert, 0x180, id1, "o-1", `{"n": 1}`), commit(0x210)}
	batches <- []wal.Item{begin(0x400), change(wal.Insert, 0x300, id2, "o-2", `{"n": 2}`)} // T2 goes on, its Commit far off
	began := time.Now()
	done := make(chan error, 1)
	go func() { done <- g.r.pipeEOS(run, batches, p, producer) }()
	consumer, err := kgo.NewClient(kgo.SeedBrokers(g.c.ListenAddrs()...), kgo.ConsumeTopics("order-events"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	defer wcancel()
	var seen []string
	for len(seen) == 0 && wctx.Err() == nil {
		consumer.PollFetches(wctx).EachRecord(func(r *kgo.Record) { seen = append(seen, string(r.Key)) })
	}
	took := time.Since(began)
	t.Logf("read_committed saw %v after %s", seen, took.Round(time.Millisecond))
	if len(seen) == 0 || seen[0] != "o-1" {
		t.Fatalf("T1 (o-1) not visible to read_committed within 3 s; saw %v", seen)
	}
	if len(seen) > 1 {
		t.Errorf("read_committed saw %v: T2's row before T2 committed", seen)
	}
	for p.tracker.Confirmed() != 0x210 && wctx.Err() == nil { // released just after the commit returns
		time.Sleep(5 * time.Millisecond)
	}
	if got := p.tracker.Confirmed(); got != 0x210 {
		t.Errorf("confirmed %s after T1's Kafka transaction committed, want T1's end 0/210", got)
	}
	close(batches)
	cancel()
	<-done
}
