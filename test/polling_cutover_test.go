package test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"
)

// A polling relay's outbox table, as docs/migrating-from-polling.md
// describes it: a status the relay marks, published_at, retry_count,
// last_error, the topic in a column and a uuid partition key.
const pollingTable = `CREATE TABLE public.relay_outbox (
    id            uuid        PRIMARY KEY,
    topic         text        NOT NULL,
    partition_key uuid        NOT NULL,
    event_type    text        NOT NULL,
    payload       jsonb       NOT NULL,
    status        text        NOT NULL DEFAULT 'PENDING',
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at  timestamptz,
    retry_count   int         NOT NULL DEFAULT 0,
    last_error    text)`

// pollingConfig is the router for that table, as the guide gives it.
const pollingConfig = `postgres:
  table: public.relay_outbox
router:
  topic_column: topic
  route_by_column: topic
  key_column: partition_key
  event_type_column: event_type
`

// pollingRelay is the relay a team runs before outboxd: it selects pending
// rows in created_at order, produces them with Java's partitioning, and
// marks them SENT. Stopping it between the produce and the mark leaves
// rows that were sent and are still PENDING, as a real relay's crash does.
type pollingRelay struct {
	d    *db
	cl   *kgo.Client
	sent atomic.Int64
	// crash makes the next poll that finds rows produce them and stop
	// before marking them, as a relay killed there does.
	crash    atomic.Bool
	unmarked int
}

var errRelayCrashed = errors.New("the relay stopped between a produce and its mark")

func newPollingRelay(t *testing.T, d *db) *pollingRelay {
	cl, err := kgo.NewClient(kgo.SeedBrokers(svc.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &pollingRelay{d: d, cl: cl}
}

// run polls until ctx ends; it stops where it is, as a killed relay does.
func (r *pollingRelay) run(ctx context.Context, partitions int) error {
	for ctx.Err() == nil {
		n, err := r.poll(ctx, partitions)
		if errors.Is(err, errRelayCrashed) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if n == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

func (r *pollingRelay) poll(ctx context.Context, partitions int) (int, error) {
	tx, err := r.d.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit, a no-op
	rows, err := tx.Query(ctx, `SELECT id::text, topic, partition_key::text, event_type, payload::text
		FROM public.relay_outbox WHERE status = 'PENDING' ORDER BY created_at, id LIMIT 50 FOR UPDATE SKIP LOCKED`)
	if err != nil {
		return 0, err
	}
	var recs []*kgo.Record
	var ids []string
	for rows.Next() {
		var id, topic, key, typ, payload string
		if err := rows.Scan(&id, &topic, &key, &typ, &payload); err != nil {
			return 0, err
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(payload),
			Partition: javaPartition([]byte(key), partitions),
			Headers:   []kgo.RecordHeader{{Key: "id", Value: []byte(id)}, {Key: "eventType", Value: []byte(typ)}}})
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(recs) == 0 {
		return 0, tx.Commit(ctx)
	}
	if err := r.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return 0, err
	}
	r.sent.Add(int64(len(recs)))
	if r.crash.Load() {
		r.unmarked = len(recs)
		return 0, errRelayCrashed
	}
	if _, err := tx.Exec(ctx, `UPDATE public.relay_outbox SET status = 'SENT', published_at = now() WHERE id = ANY($1::uuid[])`, ids); err != nil {
		return 0, err
	}
	return len(recs), tx.Commit(ctx)
}

// pollingWriters writes events to relay_outbox until stop is closed:
// writers each own their keys, so a key's commit order is its writer's.
func pollingWriters(ctx context.Context, d *db, l *ledger, topic string, stop <-chan struct{}, writers int) error {
	g, ctx := errgroup.WithContext(ctx)
	var seqMu sync.Mutex
	seq := map[string]int{}
	for w := range writers {
		keys := []string{uuid(), uuid(), uuid()}
		g.Go(func() error {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return nil
				default:
				}
				key := keys[i%len(keys)]
				seqMu.Lock()
				seq[key]++
				e := event{ID: uuid(), Type: d.name, Key: key, EventType: "Happened", Seq: seq[key], Topic: topic}
				seqMu.Unlock()
				e.Payload = fmt.Sprintf(`{"seq": %d, "writer": %d}`, e.Seq, w)
				_, err := d.pool.Exec(ctx, `INSERT INTO public.relay_outbox (id, topic, partition_key, event_type, payload) VALUES ($1, $2, $3, $4, $5)`,
					e.ID, e.Topic, e.Key, e.EventType, e.Payload)
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("writer %d: %w", w, err)
				}
				l.add(true, e)
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	return g.Wait()
}

// The cut-over from a running polling relay that docs/migrating-from-polling.md
// gives when the writers can pause for it: the relay runs under load and is
// stopped between a produce and its mark; outboxd starts and creates its
// slot; outboxd replay sends what the relay left PENDING; the writers go on.
// Nothing is lost, nothing phantom, each key in order; the repeats are the
// rows the relay sent and never marked, and consumers drop them on the id
// header.
func TestPollingRelayCutOver(t *testing.T) {
	d := newDB(t)
	d.exec(t, pollingTable)
	cfg := writeConfig(t, pollingConfig)
	l := newLedger()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The relay at work under load, stopped between a produce and its
	// mark, as a kill would leave it; then the writers pause; outboxd
	// starts and creates its slot, and the replay sends what is PENDING.
	relay, topic, stopWriters, writersDone := pollingRelayCrashed(ctx, t, d, l)
	close(stopWriters)
	if err := <-writersDone; err != nil {
		t.Fatal(err)
	}
	var pending int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM public.relay_outbox WHERE status = 'PENDING'`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	t.Logf("the relay sent %d records, the last %d of them unmarked; %d rows are PENDING at the switch", relay.sent.Load(), relay.unmarked, pending)
	p := start(t, d.env(), "-config", cfg)
	p.waitStreaming()
	rp := start(t, d.env(), "replay", "-config", cfg, "-where", "status IN ('PENDING','PROCESSING')", "-order", "created_at")
	if code := rp.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("outboxd replay exited %d", code)
	}
	rp.waitLog(fmt.Sprintf(`finished: %d rows sent`, pending), time.Second)

	// After the switch the writers go on, and outboxd streams.
	stopWriters = make(chan struct{})
	after := make(chan error, 1)
	go func() { after <- pollingWriters(ctx, d, l, topic, stopWriters, 3) }()
	time.Sleep(2 * time.Second)
	close(stopWriters)
	r := verifyLoad(t, l, after)
	if r.Duplicates != relay.unmarked {
		t.Errorf("%d duplicates; want the %d rows the relay sent and never marked, sent again", r.Duplicates, relay.unmarked)
	}
	var still int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM public.relay_outbox WHERE status = 'SENT' AND published_at IS NULL`).Scan(&still); err != nil {
		t.Fatal(err)
	}
	if still != 0 {
		t.Errorf("%d rows are SENT without published_at: outboxd wrote the table", still)
	}
}

// pollingRelayCrashed runs the polling relay on d's relay_outbox under the
// load of pollingWriters (recorded in l) until it sent 300 records, then
// stops it between a produce and its mark. The writers go on until stop is
// closed; done gives their end.
func pollingRelayCrashed(ctx context.Context, t *testing.T, d *db, l *ledger) (relay *pollingRelay, topic string, stop chan struct{}, done <-chan error) {
	t.Helper()
	topic = d.name + "-orders"
	if _, err := kadm.NewClient(kafkaClient(t)).CreateTopic(context.Background(), 6, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	relay = newPollingRelay(t, d)
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.run(relayCtx, 6) }()
	stop = make(chan struct{})
	writersDone := make(chan error, 1)
	go func() { writersDone <- pollingWriters(ctx, d, l, topic, stop, 3) }()
	deadline := time.Now().Add(30 * time.Second)
	for relay.sent.Load() < 300 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if relay.sent.Load() == 0 {
		t.Fatal("the polling relay sent nothing in 30 s")
	}
	relay.crash.Store(true)
	if err := <-relayDone; err != nil {
		t.Fatal(err)
	}
	return relay, topic, stop, writersDone
}
