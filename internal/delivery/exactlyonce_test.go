package delivery

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/eos"
	"github.com/outboxd/outboxd/internal/kfaketest"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// eosRig is a relay's configuration in exactly-once mode on a kfake
// cluster, whose postgres.dsn points at a listener that counts the
// connections made to it (and closes them: it is no Postgres), with its
// metrics.
type eosRig struct {
	cfg    config.Config
	setup  Setup // but cfg, which a test may change before pipeline
	sinkM  *sink.Metrics
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
	reg := prometheus.NewRegistry()
	setup := Setup{Log: slog.New(slog.DiscardHandler), Metrics: NewMetrics(reg), TxnMetrics: sink.NewTxnMetrics(reg), Shard: shard.Shard{Index: 0, Count: 1}}
	const system = "7441234567890123456"
	return &eosRig{cfg: cfg, setup: setup, sinkM: sink.NewMetrics(reg), c: c, dials: &dials, system: system}
}

// pipeline returns a pipeline on a transactional producer of id, and its
// context.
func (g *eosRig) pipeline(t *testing.T, ctx context.Context, id string) (*Pipeline, *sink.Producer, context.Context) {
	t.Helper()
	producer, err := sink.NewTransactional(g.cfg.Kafka, g.sinkM, g.setup.TxnMetrics, g.setup.Log, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producer.Close)
	run, fail := context.WithCancelCause(ctx)
	t.Cleanup(func() { fail(nil) })
	s := g.setup
	s.Config = g.cfg
	p := pipelineOn(t, s, run, checkpoint.New(0x100), producer, fail)
	t.Cleanup(p.Close)
	return p, producer, run
}

// server is the run's server as ReadServer would have read it on the
// run's replication connection: timeline 1, its WAL far ahead.
func (g *eosRig) server() Server {
	return Server{System: g.system, Server: eos.Server{Timeline: 1, WALEnd: 0xFFFF_FFFF}}
}

// start runs startExactlyOnce with a transactional producer of id.
func (g *eosRig) start(t *testing.T, ctx context.Context, id string) (*ExactlyOnce, error) {
	t.Helper()
	p, producer, run := g.pipeline(t, ctx, id)
	return p.startExactlyOnce(run, producer, g.server())
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
// replication connection: startExactlyOnce never dials Postgres, so a start blocked
// on Kafka does not keep a second walsender (finding 2).
func TestStartEOSUnreadablePositions(t *testing.T) {
	g := newEOSRig(t, 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const id = "outboxd-shared"
	pos := eos.Position{LSN: 0x200, Slot: g.cfg.Postgres.Slot, System: g.system}.Encode(time.Now())
	other := otherHolder(t, ctx, g.c, id, pos)
	failed := kfaketest.FailFetches(g.c, g.cfg.Kafka.PositionsTopic, time.Hour) // for longer than the test
	began := time.Now()
	_, err := g.start(t, ctx, id)
	t.Logf("startExactlyOnce = %v after %s, %d fetches failed, %d connections to Postgres", err, time.Since(began).Round(time.Millisecond), failed.Load(), g.dials.Load())
	if failed.Load() == 0 {
		t.Fatal("no fetch of the positions topic failed: the test tests nothing")
	}
	if err == nil {
		t.Fatal("startExactlyOnce succeeded with the positions partition unreadable; want an error before Init")
	}
	if n := g.dials.Load(); n != 0 {
		t.Errorf("startExactlyOnce opened %d Postgres connections while it waited on Kafka; want none before the position is read", n)
	}
	if err := other.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Errorf("the id's other holder cannot commit its open transaction: startExactlyOnce fenced it: %v", err)
	}
}

// The start applies the position to the server as the connect stage read
// it on the run's replication connection, and opens no connection to
// Postgres (issue 34 item 1): a position of timeline 1 past where the
// server's timeline 2 began is moved back to the switch point, and
// confirmed there.
func TestStartEOSOpensNoPostgresConnection(t *testing.T) {
	g := newEOSRig(t, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const id = "outboxd-promoted"
	ours := otherHolder(t, ctx, g.c, id, eos.Position{LSN: 0x200, Timeline: 1, Slot: g.cfg.Postgres.Slot, System: g.system}.Encode(time.Now()))
	if err := ours.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	server := g.server()
	server.Server.Timeline = 2
	server.Server.End = func(old int) (wal.LSN, bool, error) { return 0x150, old == 1, nil }
	p, producer, run := g.pipeline(t, ctx, id)
	_, err := p.startExactlyOnce(run, producer, server)
	if err != nil {
		t.Fatalf("startExactlyOnce: %v", err)
	}
	if n := g.dials.Load(); n != 0 {
		t.Errorf("startExactlyOnce opened %d Postgres connections; want none: the connect stage read the server", n)
	}
	if got := p.tracker.Confirmed(); got != 0x150 {
		t.Errorf("confirmed %s at the start, want the switch point 0/150", got)
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
			slot := g.cfg.Postgres.Slot
			ours := otherHolder(t, ctx, g.c, id, eos.Position{Slot: slot, System: g.system}.Encode(time.Now()))
			if err := ours.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
			theirs := otherHolder(t, ctx, g.c, id, eos.Position{LSN: 0x500, Slot: "billing", System: g.system}.Encode(time.Now()))
			if c.end != nil {
				if err := theirs.EndTransaction(ctx, *c.end); err != nil {
					t.Fatal(err)
				}
			}
			_, err := g.start(t, ctx, id)
			var refused *eos.RefusedError
			if errors.As(err, &refused) != c.refused || (!c.refused && err != nil) {
				t.Errorf("startExactlyOnce after the other deployment's position was %s = %v; want refused %v", c.name, err, c.refused)
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
	g.cfg.Kafka.TransactionInterval = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, _, run := g.pipeline(t, ctx, "outboxd-linger")
	// T2's batch is queued when T1's Commit is handled: "waiting".
	batches := make(chan []wal.Item, 2)
	batches <- []wal.Item{begin(0x200), change(wal.Insert, 0x180, id1, "o-1", `{"n": 1}`), commit(0x210)}
	batches <- []wal.Item{begin(0x400), change(wal.Insert, 0x300, id2, "o-2", `{"n": 2}`)} // T2 goes on, its Commit far off
	began := time.Now()
	done := make(chan error, 1)
	go func() { done <- p.RunExactlyOnce(run, batches, g.server()) }()
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
