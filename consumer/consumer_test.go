package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func newConsumer(t *testing.T, e *env, cfg Config, h Handler) *Consumer {
	t.Helper()
	cfg.Brokers = e.brokers
	cfg.Logger = testenv.Logger(t)
	cfg.KafkaOpts = append(cfg.KafkaOpts, kgo.MetadataMinAge(250*time.Millisecond), kgo.FetchMaxWait(200*time.Millisecond))
	c, err := New(cfg, e.pool, h)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// effect records an event's effect in a table without a unique constraint,
// so applying an event twice shows as two rows.
func effect(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
	id := ""
	for _, h := range r.Headers {
		if h.Key == "id" {
			id = string(h.Value)
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, key) VALUES ($1, $2)`, id, string(r.Key))
	return err
}

// Every record is delivered twice, the first consumer crashes between a
// database commit and its offset commit, and the group's offsets are then
// reset to the start: each effect is still applied exactly once.
func TestEffectsOnce(t *testing.T) {
	e := newEnv(t, "consumer_once")
	e.exec(t, `CREATE TABLE effects (event_id text NOT NULL, key text NOT NULL)`)
	topic := e.topic(t, "order-events", 3)
	dlt := e.topic(t, "order-dlt", 1)
	group := "g-" + testenv.RandomSuffix()

	const events = 30
	var recs []*kgo.Record
	for i := range events {
		id := uuid.Must(uuid.NewV7()).String()
		for range 2 { // outboxd after a crash: the same event again
			recs = append(recs, &kgo.Record{
				Topic: topic, Key: fmt.Appendf(nil, "k%d", i%7), Value: fmt.Appendf(nil, `{"n": %d}`, i),
				Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(id)}, {Key: "eventType", Value: []byte("OrderPlaced")}},
			})
		}
	}
	e.produce(t, recs...)

	cfg := Config{Group: group, Topics: []string{topic}, DeadLetterTopic: dlt, MaxPollRecords: 5}

	// 1: crash right after the 12th event's transaction commits.
	c1 := newConsumer(t, e, cfg, effect)
	var applied atomic.Int32
	c1.crashAfterCommit = func(*kgo.Record) bool { return applied.Add(1) == 12 }
	r1 := start(c1)
	if err := r1.wait(t, false); !errors.Is(err, errCrashed) {
		t.Fatalf("first consumer: %v; want the simulated crash", err)
	}

	// 2: the same group picks up from the committed offsets.
	reg := prometheus.NewRegistry()
	cfg2 := cfg
	cfg2.Metrics = reg
	c2 := newConsumer(t, e, cfg2, effect)
	r2 := start(c2)
	e.waitCommitted(t, group, topic, r2)
	if err := r2.wait(t, true); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(c2.m.records.WithLabelValues("applied")); got != events-12 {
		t.Errorf("second consumer applied %v events; want %d", got, events-12)
	}

	// 3: offsets reset to the start; everything is a repeat.
	offsets := kadm.Offsets{}
	for p := range int32(3) {
		offsets.AddOffset(topic, p, 0, -1)
	}
	resp, err := e.adm.CommitOffsets(context.Background(), group, offsets)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("resetting offsets: %v", err)
	}
	c3 := newConsumer(t, e, cfg, effect)
	r3 := start(c3)
	e.waitCommitted(t, group, topic, r3)
	if err := r3.wait(t, true); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(c3.m.records.WithLabelValues("duplicate")); got != 2*events {
		t.Errorf("replaying consumer skipped %v records; want %d", got, 2*events)
	}

	var rows, distinct int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT event_id) FROM effects`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != events || distinct != events {
		t.Errorf("effects: %d rows for %d distinct events; want each of %d events once", rows, distinct, events)
	}
}

// A handler that keeps failing sends its record to the dead-letter topic
// after MaxAttempts, with the error in a header; a record without an id goes
// there at once; the records after them are applied.
func TestDeadLetter(t *testing.T) {
	e := newEnv(t, "consumer_dlt")
	e.exec(t, `CREATE TABLE effects (event_id text NOT NULL, key text NOT NULL)`)
	topic := e.topic(t, "order-events", 1)
	dlt := e.topic(t, "order-dlt", 1)
	group := "g-" + testenv.RandomSuffix()
	rec := func(key, id string) *kgo.Record {
		r := &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(`{}`)}
		if id != "" {
			r.Headers = []kgo.RecordHeader{{Key: "id", Value: []byte(id)}}
		}
		return r
	}
	e.produce(t, rec("ok1", "e1"), rec("poison", "e2"), rec("no-id", ""), rec("ok2", "e3"))

	var mu sync.Mutex
	attempts := map[string]int{}
	handler := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		mu.Lock()
		attempts[string(r.Key)]++
		mu.Unlock()
		if string(r.Key) == "poison" {
			// Effects of a failed attempt are rolled back.
			if err := effect(ctx, tx, r); err != nil {
				return err
			}
			return errors.New("stock service says no")
		}
		return effect(ctx, tx, r)
	}
	c := newConsumer(t, e, Config{Group: group, Topics: []string{topic}, DeadLetterTopic: dlt,
		MaxAttempts: 3, Backoff: 10 * time.Millisecond}, handler)
	r := start(c)
	e.waitCommitted(t, group, topic, r)
	if err := r.wait(t, true); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	if attempts["poison"] != 3 || attempts["ok1"] != 1 || attempts["ok2"] != 1 || attempts["no-id"] != 0 {
		t.Errorf("handler attempts %v; want poison 3, ok1 and ok2 1, no-id 0", attempts)
	}
	mu.Unlock()
	var keys []string
	rows, err := e.pool.Query(context.Background(), `SELECT key FROM effects ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	if keys, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if strings.Join(keys, ",") != "ok1,ok2" {
		t.Errorf("effects for %v; want ok1,ok2", keys)
	}
	var processed int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM processed_events WHERE event_id = 'e2'`).Scan(&processed); err != nil {
		t.Fatal(err)
	}
	if processed != 0 {
		t.Error("the dead-lettered event was recorded as processed; it could not be replayed")
	}

	dead := readAll(t, e, dlt, 2)
	want := []struct{ key, err, attempts string }{
		{"poison", "handler: stock service says no", "3"},
		{"no-id", `record has no event id header "id"`, "0"},
	}
	for i, w := range want {
		h := headers(dead[i])
		if string(dead[i].Key) != w.key || h[HeaderError] != w.err || h[HeaderAttempts] != w.attempts ||
			h[HeaderTopic] != topic || h[HeaderPartition] != "0" || h[HeaderOffset] == "" || h[HeaderConsumer] != group {
			t.Errorf("dead letter %d: key %q headers %v; want key %q error %q attempts %s", i, dead[i].Key, h, w.key, w.err, w.attempts)
		}
	}
}

func headers(r *kgo.Record) map[string]string {
	m := map[string]string{}
	for _, h := range r.Headers {
		m[h.Key] = string(h.Value)
	}
	return m
}

// readAll reads n records of topic from its start.
func readAll(t *testing.T, e *env, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records from %s", len(recs), n, topic)
		}
		recs = append(recs, fs.Records()...)
	}
	return recs
}

// Prune, and Run with Retention, delete this consumer's rows older than the
// window and nothing else.
func TestRetention(t *testing.T) {
	e := newEnv(t, "consumer_retention")
	topic := e.topic(t, "order-events", 1)
	dlt := e.topic(t, "order-dlt", 1)
	seed := func() {
		e.exec(t, `TRUNCATE processed_events`)
		e.exec(t, `INSERT INTO processed_events (consumer, event_id, processed_at) VALUES
			('a', 'old1', now() - interval '10 days'), ('a', 'old2', now() - interval '8 days'),
			('a', 'new1', now() - interval '6 days'), ('a', 'new2', now()),
			('b', 'old1', now() - interval '10 days')`)
	}
	remaining := func() string {
		rows, err := e.pool.Query(context.Background(), `SELECT consumer || ':' || event_id FROM processed_events ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(got, ",")
	}
	const want = "a:new1,a:new2,b:old1"
	cfg := Config{Group: "g-" + testenv.RandomSuffix(), Name: "a", Topics: []string{topic}, DeadLetterTopic: dlt}

	seed()
	c := newConsumer(t, e, cfg, effect)
	n, err := c.Prune(context.Background(), time.Now().Add(-7*24*time.Hour))
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got := remaining(); n != 2 || got != want {
		t.Errorf("Prune deleted %d rows, left %s; want 2 deleted, %s left", n, got, want)
	}

	seed()
	cfg.Retention, cfg.RetentionInterval = 7*24*time.Hour, 50*time.Millisecond
	r := start(newConsumer(t, e, cfg, effect))
	deadline := time.Now().Add(10 * time.Second)
	for remaining() != want && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := r.wait(t, true); err != nil {
		t.Fatal(err)
	}
	if got := remaining(); got != want {
		t.Errorf("Run with Retention left %s; want %s", got, want)
	}
}

func TestNewRejects(t *testing.T) {
	ok := Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, DeadLetterTopic: "d"}
	h := func(context.Context, pgx.Tx, *kgo.Record) error { return nil }
	for _, c := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no brokers", func(c *Config) { c.Brokers = nil }, "Brokers is empty"},
		{"no group", func(c *Config) { c.Group = "" }, "Group is empty"},
		{"no topics", func(c *Config) { c.Topics = nil }, "Topics is empty"},
		{"no dead-letter topic", func(c *Config) { c.DeadLetterTopic = "" }, "DeadLetterTopic is empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.edit(&cfg)
			_, err := New(cfg, nil, h)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v; want an error containing %q", err, c.want)
			}
		})
	}
}

// A second Run would start from the client's fetch position, past records
// the first polled but did not apply, and commit past them: it is refused.
func TestRunOnlyOnce(t *testing.T) {
	// With topic auto-creation the dead-letter topic is not looked up, so
	// the first Run polls (and returns at once: its context is done).
	cfg := Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, DeadLetterTopic: "d",
		KafkaOpts: []kgo.Opt{kgo.AllowAutoTopicCreation()}}
	c, err := New(cfg, fakeDB{}, func(context.Context, pgx.Tx, *kgo.Record) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = c.Run(ctx)
	if err := c.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "Run may be called once") {
		t.Fatalf("second Run: %v; want it refused", err)
	}
}

// Run refuses to start without its dead-letter topic, rather than failing
// when a record first needs it.
func TestMissingDeadLetterTopic(t *testing.T) {
	e := newEnv(t, "consumer_nodlt")
	topic := e.topic(t, "order-events", 1)
	c := newConsumer(t, e, Config{Group: "g-" + testenv.RandomSuffix(), Topics: []string{topic}, DeadLetterTopic: "missing-" + testenv.RandomSuffix()}, effect)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Run(ctx); err == nil || !strings.Contains(err.Error(), "does not exist; create it") {
		t.Fatalf("Run: %v; want the missing dead-letter topic named", err)
	}
	// Nothing was polled, so Run may try again (and fails the same way).
	if err := c.Run(ctx); err == nil || !strings.Contains(err.Error(), "does not exist; create it") {
		t.Fatalf("second Run: %v; want the missing dead-letter topic named again", err)
	}
}

// fakeDB is a DB for tests that never reach the database.
type fakeDB struct{}

func (fakeDB) Begin(context.Context) (pgx.Tx, error) { return nil, errors.New("fakeDB") }
func (fakeDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errors.New("fakeDB")
}
