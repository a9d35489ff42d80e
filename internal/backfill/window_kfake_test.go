package backfill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/kfaketest"
	"github.com/outboxd/outboxd/internal/replay"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// An at-least-once backfill's pipeline under a produce failure in the
// middle of its window: the second page's records (topic bad-events, on one
// broker) are refused after the pages behind it (order-events, on the
// other broker) were acknowledged. Every cursor the run saves has every row
// up to it in Kafka, the run fails with the refusal, and a run resumed from
// the last cursor saved delivers every row: none is skipped. Fails when
// window.settled passes over a failed page.
func TestPipelineCursorOnKfake(t *testing.T) {
	const batch, pages = 10, 10
	c, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(1, "order-events", "bad-events"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	badNode := c.LeaderFor("bad-events", 0)
	if c.LeaderFor("order-events", 0) == badNode {
		if err := c.MoveTopicPartition("order-events", 0, 1-badNode); err != nil {
			t.Fatal(err)
		}
	}
	// The bad broker refuses every produce, after holding it long enough
	// for the other broker to acknowledge the pages behind.
	var refuse atomic.Bool
	refuse.Store(true)
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !refuse.Load() || c.CurrentNode() != badNode {
			return nil, nil, false
		}
		c.SleepControl(func() { time.Sleep(300 * time.Millisecond) })
		return kfaketest.ProduceResponse(req, kerr.InvalidRecord.Code), nil, true
	})

	cfg, rel, r := pipelineSetup(t, c, batch, 10*time.Second)
	// Row i is keyed %06d; the second page goes to bad-events.
	var rows []row
	for i := range batch * pages {
		typ := "order"
		if i/batch == 1 {
			typ = "bad"
		}
		text := func(s string) wal.Datum { return wal.Datum{Kind: wal.DatumText, Data: []byte(s)} }
		rows = append(rows, row{key: []string{fmt.Sprintf("%06d", i)}, tuple: []wal.Datum{
			text(fmt.Sprintf("00000000-0000-0000-0000-%012d", i)), text(typ), text("k"), text("Created"), text(strconv.Itoa(i))}})
	}
	read := func(_ context.Context, after []string) ([]row, error) {
		from := 0
		if after != nil {
			n, _ := strconv.Atoi(after[0])
			from = n + 1
		}
		return rows[min(from, len(rows)):min(from+batch, len(rows))], nil
	}
	var mu sync.Mutex
	var saves []State
	run := func(st State) error {
		reg := prometheus.NewRegistry()
		p, err := sink.New(cfg.Kafka, sink.NewMetrics(reg), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		b := &sender{cfg: cfg, log: slog.New(slog.DiscardHandler), state: st, src: replay.Source{Relation: rel, Router: r},
			producer: p, m: NewMetrics(reg), progress: func(int64, int64) {}, read: read,
			save: func(_ context.Context, st State) error { mu.Lock(); saves = append(saves, st); mu.Unlock(); return nil }}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return b.pipe(ctx, time.Now())
	}
	// inKafka is the rows in Kafka, by index.
	inKafka := func() map[int]int {
		got := map[int]int{}
		for _, topic := range []string{"order-events", "bad-events"} {
			values, err := kfaketest.ReadCommitted(c, topic)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range values {
				i, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("value %q in %s", v, topic)
				}
				got[i]++
			}
		}
		return got
	}

	st := State{Slot: "outboxd", Total: int64(len(rows)), Phase: phaseSending}
	err = run(st)
	if !errors.Is(err, kerr.InvalidRecord) {
		t.Fatalf("the run ended with %v, want the refused record's error", err)
	}
	got := inKafka()
	if got[2*batch] == 0 {
		t.Fatalf("no page after the refused one was acknowledged before the refusal (%v): the test shows nothing", got)
	}
	if len(saves) == 0 {
		t.Fatal("no cursor saved: the first page was acknowledged")
	}
	for _, s := range saves {
		for i := range int(s.Sent) {
			if got[i] == 0 {
				t.Fatalf("a cursor saved after row %v (%d rows) passed row %d, which Kafka did not acknowledge", s.Done, s.Sent, i)
			}
		}
	}
	resumeAt := saves[len(saves)-1]
	t.Logf("first run: %v; saved %d cursors, the last after row %v", err, len(saves), resumeAt.Done)

	refuse.Store(false)
	if err := run(resumeAt); err != nil {
		t.Fatalf("the resumed run: %v", err)
	}
	got = inKafka()
	for i := range rows {
		if got[i] == 0 {
			t.Errorf("row %d never delivered: skipped", i)
		}
	}
	if last := saves[len(saves)-1]; last.Sent != int64(len(rows)) {
		t.Errorf("the resumed run saved %d rows done, want %d", last.Sent, len(rows))
	}
}

// pipelineSetup is the configuration of a backfill of batch-row pages into
// the kfake cluster c, the outbox relation its rows come from and the
// router for them.
func pipelineSetup(t *testing.T, c *kfake.Cluster, batch int, deliveryTimeout time.Duration) (config.Config, *wal.Relation, *router.Router) {
	t.Helper()
	cfg := config.Default()
	cfg.Kafka.Brokers = c.ListenAddrs()
	cfg.Kafka.TopicPartitions, cfg.Kafka.TopicReplicationFactor = 1, 1
	cfg.Kafka.DeliveryTimeout = deliveryTimeout
	cfg.Postgres.Backfill.Batch = batch
	rel := &wal.Relation{ID: 16384, Namespace: "public", Name: "outbox", Columns: []wal.Column{
		{Name: "id", TypeOID: 2950, Key: true}, {Name: "aggregate_type", TypeOID: 25}, {Name: "aggregate_id", TypeOID: 25},
		{Name: "event_type", TypeOID: 25}, {Name: "payload", TypeOID: 3802}}}
	r, err := router.New(cfg.Router, router.Schema{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, rel, r
}
