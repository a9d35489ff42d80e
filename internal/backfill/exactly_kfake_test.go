package backfill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/eos"
	"github.com/outboxd/outboxd/internal/kfaketest"
	"github.com/outboxd/outboxd/internal/replay"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// kfakeBackfill is an exactly-once backfill's Kafka side on a kfake
// cluster: its configuration and the state whose cursor it commits.
type kfakeBackfill struct {
	c     *kfake.Cluster
	cfg   config.Config
	reg   *prometheus.Registry
	sinkM *sink.Metrics
	txnM  *sink.TxnMetrics
	owner eos.Owner
	state State
}

func newKfakeBackfill(t *testing.T) *kfakeBackfill {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, config.Default().Kafka.PositionsTopic, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg := config.Default()
	cfg.Kafka.Brokers = c.ListenAddrs()
	cfg.Kafka.Delivery = config.ExactlyOnce
	cfg.Kafka.TopicPartitions, cfg.Kafka.TopicReplicationFactor = 1, 1
	cfg.Kafka.DeliveryTimeout = 10 * time.Second
	reg := prometheus.NewRegistry()
	return &kfakeBackfill{c: c, cfg: cfg, reg: reg, sinkM: sink.NewMetrics(reg), txnM: sink.NewTxnMetrics(reg),
		owner: eos.Owner{Slot: "outboxd", System: "7441234567890123456", ID: "outboxd-7441234567890123456-outboxd", Topic: cfg.Kafka.PositionsTopic},
		state: State{Slot: "outboxd", LSN: "0/1500", Started: time.Date(2026, 1, 1, 0, 0, 0, 1, time.UTC), Phase: phaseSending}}
}

// instance initialises a transactional producer of the backfill's id, as
// a run does after Open (fencing the id's previous holder), and reads what
// the id committed.
func (k *kfakeBackfill) instance(t *testing.T, ctx context.Context) (*txns, Committed) {
	t.Helper()
	p, err := sink.NewTransactional(k.cfg.Kafka, k.sinkM, k.txnM, slog.New(slog.DiscardHandler), k.owner.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.Init(ctx); err != nil {
		t.Fatal(err)
	}
	value, found, err := p.ReadPosition(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pos eos.Position
	if found {
		if pos, found, err = eos.Read(value, k.owner); err != nil {
			t.Fatal(err)
		}
	}
	return &txns{p: p, owner: k.owner, limits: eos.LimitsOf(k.cfg.Kafka)}, Committed{Owner: k.owner, Position: pos, Found: found}
}

// send produces rows first..first+n-1 in the open (or a new) transaction
// and waits for Kafka's answer to each.
func send(ctx context.Context, x *txns, first, n int) error {
	acks := make(chan error, n)
	for i := first; i < first+n; i++ {
		rec := &router.Record{Topic: "orders", Key: []byte("k"), Value: fmt.Appendf(nil, "row-%d", i), Partition: -1}
		if err := x.add(time.Now(), rec.Size()); err != nil {
			return err
		}
		if err := x.p.Produce(ctx, rec, func(err error) { acks <- err }); err != nil {
			return err
		}
	}
	return replay.AwaitAcks(ctx, acks, n, time.Second)
}

// The windows of an exactly-once backfill's Kafka side (DESIGN.md,
// "Backfill", exactly-once): a transaction that fails on a produce error is
// aborted, and a read_committed consumer never sees its rows; a run after
// it resumes from the cursor the last commit wrote; an instance that a
// second one fenced cannot commit the rows it holds. Each row is seen once.
func TestTransactionsOnKfake(t *testing.T) {
	k := newKfakeBackfill(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Run 1 commits rows 0-2 with their cursor.
	a, read := k.instance(t, ctx)
	r, err := resume(k.state, read, storeIn("public", "outboxd"))
	if err != nil || r.fromKafka {
		t.Fatalf("first run: resume = %+v, %v; want Postgres's (empty) cursor", r, err)
	}
	if err := send(ctx, a, 0, 3); err != nil {
		t.Fatal(err)
	}
	st := k.state
	st.Done, st.Sent = []string{"2"}, 3
	if err := a.commit(ctx, cursorOf(st, false)); err != nil {
		t.Fatal(err)
	}

	// Its next transaction fails on a record Kafka refuses: aborted.
	var refuse atomic.Bool
	refuse.Store(true)
	k.c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		k.c.KeepControl()
		for _, t := range req.(*kmsg.ProduceRequest).Topics {
			if t.Topic == "orders" && refuse.Load() {
				return kfaketest.ProduceResponse(req, kerr.InvalidRecord.Code), nil, true
			}
		}
		return nil, nil, false
	})
	sendErr := send(ctx, a, 3, 2)
	if sendErr == nil {
		t.Fatal("a transaction with a refused record went through")
	}
	if err := a.end(ctx, sendErr); !errors.Is(err, kerr.InvalidRecord) {
		t.Errorf("end = %v, want the refused record's error", err)
	}
	if a.p.InTransaction() {
		t.Error("the failed transaction is still open after end")
	}
	refuse.Store(false)

	// Run 2 (another instance, or the same restarted) resumes from Kafka's
	// cursor even though Postgres recorded nothing, and commits rows 3-4;
	// run 1's producer, fenced, cannot commit rows it holds.
	b, read := k.instance(t, ctx)
	r, err = resume(k.state, read, storeIn("public", "outboxd"))
	if err != nil || !r.fromKafka || r.Sent != 3 || !slices.Equal(r.Done, []string{"2"}) {
		t.Fatalf("second run: resume = %+v, %v; want after row 2, 3 rows, from Kafka", r, err)
	}
	if err := send(ctx, b, 3, 2); err != nil {
		t.Fatal(err)
	}
	st.Done, st.Sent = []string{"4"}, 5
	if err := b.commit(ctx, cursorOf(st, true)); err != nil {
		t.Fatal(err)
	}
	zombieErr := send(ctx, a, 3, 2)
	if zombieErr == nil {
		zombieErr = a.commit(ctx, cursorOf(st, true))
	}
	var fenced *sink.FencedError
	if err := a.end(ctx, zombieErr); !errors.As(err, &fenced) {
		t.Errorf("the fenced instance's send ended with %v, want a *sink.FencedError", err)
	}

	got, err := kfaketest.ReadCommitted(k.c, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"row-0", "row-1", "row-2", "row-3", "row-4"}; !slices.Equal(got, want) {
		t.Errorf("read_committed saw %v, want %v: each row once", got, want)
	}
	_, read = k.instance(t, ctx)
	if r, err := resume(k.state, read, storeIn("public", "outboxd")); err != nil || !r.finished || r.Sent != 5 {
		t.Errorf("third run: resume = %+v, %v; want finished, 5 rows", r, err)
	}
}

// The first way out of a StreamedError works: a tombstone for the id's
// key in the positions topic, which the refusal names, makes the next run
// go on after the rows Postgres recorded, where a restart alone reads the
// other process's stream position again (review-fix55 Should 1).
func TestStreamedTombstoneOnKfake(t *testing.T) {
	k := newKfakeBackfill(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Another process streamed the slot: a stream position past the
	// consistent point, 0/1500.
	other, _ := k.instance(t, ctx)
	if err := other.p.Begin(); err != nil {
		t.Fatal(err)
	}
	if err := other.p.Commit(ctx, eos.Position{LSN: 0x1600, Slot: k.owner.Slot, System: k.owner.System}.Encode(time.Now())); err != nil {
		t.Fatal(err)
	}
	var se *StreamedError
	for range 2 { // a restart reads it again
		_, read := k.instance(t, ctx)
		if _, err := resume(k.state, read, storeIn("public", "outboxd")); !errors.As(err, &se) {
			t.Fatalf("resume after another process's stream position = %v, want a *StreamedError", err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: k.owner.Topic, Key: []byte(k.owner.ID)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	_, read := k.instance(t, ctx)
	if r, err := resume(k.state, read, storeIn("public", "outboxd")); err != nil || r.fromKafka {
		t.Fatalf("resume after the tombstone = %+v, %v; want Postgres's cursor", r, err)
	}
}
