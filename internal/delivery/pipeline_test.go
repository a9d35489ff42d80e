package delivery

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/eos"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// The pipeline's routing, delivery and dead-letter paths, driven item by
// item with a fake producer: no Postgres, no Kafka.

// fakeProducer keeps what it was handed; the test acknowledges or fails
// each record through ack. refuse, if set, is asked first and may refuse a
// record as sink.Producer does (done is then never called).
type fakeProducer struct {
	refuse func(*router.Record) error

	mu    sync.Mutex
	recs  []router.Record // copies: the pipeline reuses its record
	dones []func(error)
}

func (f *fakeProducer) Produce(_ context.Context, rec *router.Record, done func(error)) error {
	if f.refuse != nil {
		if err := f.refuse(rec); err != nil {
			return err
		}
	}
	c := *rec
	c.Key, c.Value = bytes.Clone(rec.Key), bytes.Clone(rec.Value)
	c.Headers = make([]router.Header, len(rec.Headers))
	for i, h := range rec.Headers {
		c.Headers[i] = router.Header{Key: h.Key, Value: bytes.Clone(h.Value)}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recs = append(f.recs, c)
	f.dones = append(f.dones, done)
	return nil
}

// ackAll reports every record handed over so far with err.
func (f *fakeProducer) ackAll(err error) {
	f.mu.Lock()
	dones := f.dones
	f.dones = nil
	f.mu.Unlock()
	for _, d := range dones {
		d(err)
	}
}

// testPipeline is one run of the pipeline on a fake producer.
type testPipeline struct {
	*Pipeline
	prod    *fakeProducer
	tracker *checkpoint.Tracker
	run     context.Context // ends, with the failure as its cause, when a record fails
}

// setupOf is the Setup of an unsharded run with cfg, logging to log, its
// metrics on a registry of their own.
func setupOf(cfg config.Config, log *slog.Logger) Setup {
	return Setup{Config: cfg, Log: log, Metrics: NewMetrics(prometheus.NewRegistry()), Shard: shard.Shard{Index: 0, Count: 1}}
}

// pipelineOn is the pipeline of a run of s on prod, with no server for its
// catalogue lookups.
func pipelineOn(t testing.TB, s Setup, run context.Context, tracker *checkpoint.Tracker, prod Producer, fail context.CancelCauseFunc) *Pipeline {
	t.Helper()
	s.Tracker, s.Producer, s.Fail = tracker, prod, fail
	p, err := NewPipeline(run, s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// isPermanent and hintOf read err as relay.IsPermanent and relay.Hint do:
// permanent when an error in its chain says so, and the outermost hint.
func isPermanent(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if p, ok := err.(interface{ Permanent() bool }); ok && p.Permanent() {
			return true
		}
	}
	return false
}

func hintOf(err error) string {
	for ; err != nil; err = errors.Unwrap(err) {
		if h, ok := err.(interface{ Hint() string }); ok && h.Hint() != "" {
			return h.Hint()
		}
	}
	return ""
}

func newTestPipeline(t *testing.T, tune func(*config.Config)) *testPipeline {
	t.Helper()
	cfg := config.Default()
	if tune != nil {
		tune(&cfg)
	}
	return newTestPipelineOf(t, setupOf(cfg, slog.New(slog.DiscardHandler)))
}

// newTestPipelineOf is newTestPipeline for the Setup s.
func newTestPipelineOf(t *testing.T, s Setup) *testPipeline {
	t.Helper()
	run, fail := context.WithCancelCause(context.Background())
	t.Cleanup(func() { fail(nil) })
	prod := &fakeProducer{}
	tracker := checkpoint.New(0x100)
	p := pipelineOn(t, s, run, tracker, prod, fail)
	t.Cleanup(p.Close)
	return &testPipeline{Pipeline: p, prod: prod, tracker: tracker, run: run}
}

// handle hands items to the pipeline and fails the test on an error.
func (tp *testPipeline) handle(t *testing.T, items ...wal.Item) {
	t.Helper()
	for _, it := range items {
		if err := tp.Handle(it); err != nil {
			t.Fatalf("Handle(%T): %v", it, err)
		}
	}
}

// The outbox table of the default configuration, with built-in column types.
var outboxRel = &wal.Relation{ID: 16400, Namespace: "public", Name: "outbox", Columns: []wal.Column{
	{Name: "id", TypeOID: 2950, Key: true}, // uuid
	{Name: "aggregate_type", TypeOID: 25},  // text
	{Name: "aggregate_id", TypeOID: 25},
	{Name: "event_type", TypeOID: 25},
	{Name: "payload", TypeOID: 3802}, // jsonb
}}

var commitTime = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

func begin(final wal.LSN) *wal.Begin {
	return &wal.Begin{XID: 7, FinalLSN: final, CommitTime: commitTime}
}

func commit(end wal.LSN) *wal.Commit {
	return &wal.Commit{XID: 7, CommitLSN: end - 0x10, EndLSN: end, CommitTime: commitTime}
}

// change is a row change of the outbox table; an empty id is NULL.
func change(op wal.Op, lsn wal.LSN, id, key, payload string) *wal.Change {
	text := func(s string) wal.Datum {
		if s == "" {
			return wal.Datum{Kind: wal.DatumNull}
		}
		return wal.Datum{Kind: wal.DatumText, Data: []byte(s)}
	}
	return &wal.Change{Op: op, XID: 7, LSN: lsn, CommitTime: commitTime, Relation: outboxRel,
		Tuple: []wal.Datum{text(id), text("order"), text(key), text("OrderCreated"), text(payload)}}
}

const (
	id1 = "7f1c2a9e-2b8e-4c55-9d3e-2a1f0c9b8e01"
	id2 = "7f1c2a9e-2b8e-4c55-9d3e-2a1f0c9b8e02"
)

func header(rec router.Record, key string) string {
	for _, h := range rec.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Inserts are routed and handed over in order; updates and deletes are
// counted, not delivered; the transaction is confirmed at its end LSN only
// once every record is acknowledged.
func TestPipelineRoutesInserts(t *testing.T) {
	tp := newTestPipeline(t, nil)
	tp.handle(t, begin(0x200),
		change(wal.Insert, 0x180, id1, "o-1", `{"n": 1}`),
		change(wal.Update, 0x188, id1, "o-1", `{"n": 1}`),
		change(wal.Delete, 0x190, id1, "o-1", `{"n": 1}`),
		change(wal.Insert, 0x198, id2, "o-2", `{"n": 2}`),
		commit(0x210))
	if n := len(tp.prod.recs); n != 2 {
		t.Fatalf("%d records handed over, want 2 (the inserts)", n)
	}
	for i, want := range []struct{ id, key, value string }{{id1, "o-1", `{"n": 1}`}, {id2, "o-2", `{"n": 2}`}} {
		rec := tp.prod.recs[i]
		if rec.Topic != "order-events" || string(rec.Key) != want.key || string(rec.Value) != want.value || header(rec, "id") != want.id {
			t.Errorf("record %d: topic %s key %s value %s id %s; want order-events, %s, %s, %s",
				i, rec.Topic, rec.Key, rec.Value, header(rec, "id"), want.key, want.value, want.id)
		}
	}
	if got := tp.tracker.Confirmed(); got != 0x100 {
		t.Errorf("confirmed %s before Kafka acknowledged, want the start 0/100", got)
	}
	tp.prod.ackAll(nil)
	if got := tp.tracker.Confirmed(); got != 0x210 {
		t.Errorf("confirmed %s after every acknowledgement, want the commit's end 0/210", got)
	}
	for op, want := range map[string]float64{"insert": 2, "update": 1, "delete": 1} {
		if got := testutil.ToFloat64(tp.m.changes.WithLabelValues(op, "public.outbox")); got != want {
			t.Errorf("outboxd_wal_changes_total{op=%q,table=\"public.outbox\"} = %v, want %v", op, got, want)
		}
	}
}

// A record Kafka fails ends the run with its error, and nothing of its
// transaction is confirmed.
func TestPipelineDeliveryFailure(t *testing.T) {
	tp := newTestPipeline(t, nil)
	tp.handle(t, begin(0x200), change(wal.Insert, 0x180, id1, "o-1", `{}`), commit(0x210))
	refused := errors.New("refused by the broker")
	tp.prod.ackAll(refused)
	if cause := context.Cause(tp.run); !errors.Is(cause, refused) {
		t.Errorf("run ended with %v, want the delivery error", cause)
	}
	if got := tp.tracker.Confirmed(); got != 0x100 {
		t.Errorf("confirmed %s past a failed record", got)
	}
}

// A row that cannot be routed (poison) or that the producer refuses
// (oversized) stops the pipeline under poison.policy halt, and goes to the
// dead-letter topic under dlq, with headers saying why and where from; its
// transaction is then confirmed once the dead letter is acknowledged.
func TestPipelineDeadLetter(t *testing.T) {
	tooLarge := func(rec *router.Record) error {
		if rec.Topic == "dead" {
			return nil
		}
		return &router.RowError{EventID: rec.EventID, Topic: rec.Topic, Key: rec.Key, Value: rec.Value,
			Reason: "the record is 2000000 bytes, over kafka.max_message_bytes (1048576)"}
	}
	for _, tc := range []struct {
		name       string
		row        *wal.Change
		refuse     func(*router.Record) error
		reason     string // in the error, and the dead letter's reason header
		intended   string // the dead letter's intended-topic header
		keepsValue bool
	}{
		{name: "poison", row: change(wal.Insert, 0x180, "", "o-1", `{"n": 1}`),
			reason: "column id is NULL", intended: ""},
		{name: "oversized", row: change(wal.Insert, 0x180, id1, "o-1", `{"n": 1}`), refuse: tooLarge,
			reason: "over kafka.max_message_bytes", intended: "order-events", keepsValue: true},
	} {
		t.Run(tc.name+"/halt", func(t *testing.T) {
			tp := newTestPipeline(t, nil)
			tp.prod.refuse = tc.refuse
			tp.handle(t, begin(0x200))
			err := tp.Handle(tc.row)
			var rowErr *router.RowError
			if !errors.As(err, &rowErr) || !strings.Contains(err.Error(), tc.reason) || !strings.Contains(hintOf(err), "router.poison.policy: dlq") {
				t.Fatalf("Handle = %v (hint %q), want the row's error naming %q and the dlq policy in the hint", err, hintOf(err), tc.reason)
			}
			if !isPermanent(err) {
				t.Errorf("isPermanent(%v) = false: a restart meets the same row", err)
			}
			if n := len(tp.prod.recs); n != 0 {
				t.Errorf("%d records handed over, want none", n)
			}
		})
		t.Run(tc.name+"/dlq", func(t *testing.T) {
			tp := newTestPipeline(t, func(c *config.Config) {
				c.Router.Poison.Policy = "dlq"
				c.Router.Poison.DLQTopic = "dead"
			})
			tp.prod.refuse = tc.refuse
			tp.handle(t, begin(0x200), tc.row, commit(0x210))
			if n := len(tp.prod.recs); n != 1 {
				t.Fatalf("%d records handed over, want the dead letter alone", n)
			}
			dl := tp.prod.recs[0]
			if dl.Topic != "dead" || string(dl.Key) != "o-1" {
				t.Errorf("dead letter to %s with key %s, want dead and o-1", dl.Topic, dl.Key)
			}
			if got := string(dl.Value); tc.keepsValue && got != `{"n": 1}` {
				t.Errorf("dead letter value %q, want the row's payload", got)
			}
			for k, want := range map[string]string{"outboxd.source.lsn": "0/180", "outboxd.source.table": "public.outbox", "outboxd.intended.topic": tc.intended} {
				if got := header(dl, k); got != want {
					t.Errorf("header %s = %q, want %q", k, got, want)
				}
			}
			if got := header(dl, "outboxd.error.reason"); !strings.Contains(got, tc.reason) {
				t.Errorf("reason header %q lacks %q", got, tc.reason)
			}
			if got := testutil.ToFloat64(tp.m.deadLettered.WithLabelValues("public.outbox")); got != 1 {
				t.Errorf("outboxd_router_dead_lettered_total{table=\"public.outbox\"} = %v, want 1", got)
			}
			tp.prod.ackAll(nil)
			if got := tp.tracker.Confirmed(); got != 0x210 {
				t.Errorf("confirmed %s after the dead letter's acknowledgement, want 0/210", got)
			}
		})
	}
}

// router.on_update: error stops the pipeline for good, warn and ignore go
// on without delivering the update.
func TestPipelineUpdate(t *testing.T) {
	for _, tc := range []struct {
		onUpdate string
		stops    bool
	}{{"error", true}, {"warn", false}, {"ignore", false}} {
		t.Run(tc.onUpdate, func(t *testing.T) {
			tp := newTestPipeline(t, func(c *config.Config) { c.Router.OnUpdate = config.OnUpdate(tc.onUpdate) })
			tp.handle(t, begin(0x200))
			err := tp.Handle(change(wal.Update, 0x180, id1, "o-1", `{}`))
			switch {
			case tc.stops && (!errors.Is(err, ErrUpdate) || !isPermanent(err) || !strings.Contains(hintOf(err), "router.on_update: warn")):
				t.Errorf("Handle = %v (hint %q), want the permanent ErrUpdate with what to do", err, hintOf(err))
			case !tc.stops && err != nil:
				t.Errorf("Handle = %v, want nil", err)
			}
			if n := len(tp.prod.recs); n != 0 {
				t.Errorf("%d records handed over for an update", n)
			}
		})
	}
}

// A keepalive advances the confirmed position to the server's WAL end
// while nothing is in flight, and never past a transaction in flight.
func TestPipelineKeepalive(t *testing.T) {
	tp := newTestPipeline(t, nil)
	tp.handle(t, wal.Keepalive{WALEnd: 0x150})
	if got := tp.tracker.Confirmed(); got != 0x150 {
		t.Errorf("idle: confirmed %s, want the WAL end 0/150", got)
	}
	tp.handle(t, begin(0x200), change(wal.Insert, 0x180, id1, "o-1", `{}`), commit(0x210), wal.Keepalive{WALEnd: 0x300})
	if got := tp.tracker.Confirmed(); got != 0x150 {
		t.Errorf("in flight: confirmed %s, want 0/150", got)
	}
	tp.prod.ackAll(nil)
	tp.handle(t, wal.Keepalive{WALEnd: 0x300})
	if got := tp.tracker.Confirmed(); got != 0x300 {
		t.Errorf("acknowledged and idle: confirmed %s, want 0/300", got)
	}
}

// An item the pipeline does not know (here a keepalive by pointer, which
// satisfies wal.Item through its value method) is an error, never dropped:
// a dropped keepalive would pin WAL.
func TestPipelineUnknownItem(t *testing.T) {
	tp := newTestPipeline(t, nil)
	if err := tp.Handle(&wal.Keepalive{WALEnd: 0x150}); err == nil {
		t.Fatal("Handle(*wal.Keepalive) = nil, want an error")
	}
	if got := tp.tracker.Confirmed(); got != 0x100 {
		t.Errorf("confirmed %s after an unknown item, want 0/100", got)
	}
}

// A logical message is delivered by the deployment whose outbox table it
// names (router.OwnerField), exactly as spelled, one that names another
// table by none, and one that names none (no field, null or "") by the
// deployment with router.messages.unowned: deliver only. The decision reads
// the message alone (issue 32 item 12; review findings 1-7).
func TestPipelineDeliversOnlyItsOwnMessages(t *testing.T) {
	msg := func(owner string) *wal.Message {
		field := ""
		if owner != "" {
			field = `, "__outbox_table": ` + owner
		}
		return &wal.Message{XID: 7, LSN: 0x200, Transactional: true, Prefix: "outbox",
			Content: []byte(`{"id": "m", "aggregate_type": "order", "aggregate_id": "k", "payload": {}` + field + `}`)}
	}
	const (
		own = iota
		other
		unowned
	)
	long := `"public.` + strings.Repeat("o", 63) + `"` // Postgres would truncate it to 63 bytes
	for _, tc := range []struct {
		name    string
		unowned config.Unowned
		owner   string // the field's JSON value, "" for no field
		kind    int
	}{
		{"its own", config.UnownedIgnore, `"public.outbox"`, own},
		{"its own, unqualified", config.UnownedIgnore, `"outbox"`, own},
		{"its own, taking the unowned", config.UnownedDeliver, `"public.outbox"`, own},
		{"another deployment's", config.UnownedDeliver, `"public.orders_outbox"`, other},
		{"another deployment's, unqualified", config.UnownedDeliver, `"orders_outbox"`, other},
		// No catalogue is read: a table that nothing streams, or that does
		// not exist, is another table all the same.
		{"a table nothing else streams", config.UnownedDeliver, `"public.no_such_table"`, other},
		{"its own, spelled in capitals", config.UnownedDeliver, `"Public.Outbox"`, other},
		{"its own, quoted", config.UnownedDeliver, `"\"public\".\"outbox\""`, other},
		{"its own with a NUL", config.UnownedDeliver, `"public.outbox\u0000"`, other},
		{"longer than an identifier", config.UnownedDeliver, long, other},
		{"unowned, taken", config.UnownedDeliver, "", unowned},
		{"unowned, left", config.UnownedIgnore, "", unowned},
		{"owner null, taken", config.UnownedDeliver, "null", unowned},
		{"owner null, left", config.UnownedIgnore, "null", unowned},
		{"owner empty, taken", config.UnownedDeliver, `""`, unowned},
		{"owner empty, left", config.UnownedIgnore, `""`, unowned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := newTestPipeline(t, func(c *config.Config) { c.Router.Messages.Unowned = tc.unowned })
			tp.handle(t, begin(0x300), msg(tc.owner), commit(0x310))
			want := tc.kind == own || tc.kind == unowned && tc.unowned == config.UnownedDeliver
			if got := len(tp.prod.recs) == 1; got != want {
				t.Fatalf("delivered %v, want %v", got, want)
			}
			if want && header(tp.prod.recs[0], "id") != "m" {
				t.Errorf("delivered %+v", tp.prod.recs[0])
			}
			tp.prod.ackAll(nil)
			if got := tp.tracker.Confirmed(); got != 0x310 {
				t.Errorf("confirmed %s, want 0/310: a message left to another deployment is confirmed past", got)
			}
			for op, n := range map[string]bool{"message_other_outbox": tc.kind == other, "message_unowned": tc.kind == unowned && !want} {
				want := map[bool]float64{true: 1, false: 0}[n]
				if got := testutil.ToFloat64(tp.m.changes.WithLabelValues(op, "")); got != want {
					t.Errorf("outboxd_wal_changes_total{op=%q} = %v, want %v", op, got, want)
				}
			}
		})
	}
	// Content that is not a JSON object, or whose owner is not a string,
	// names no owner: the deployment that takes unowned messages halts on
	// it as a poison row, the others leave it.
	for _, content := range []string{"not json", `{"id": "m", "__outbox_table": 42}`, `{"id": "m", "__outbox_table": true}`,
		`{"id": "m", "__outbox_table": {"t": "public.outbox"}}`, `{"id": "m", "__outbox_table": ["public.outbox"]}`} {
		for _, unowned := range []config.Unowned{config.UnownedDeliver, config.UnownedIgnore} {
			tp := newTestPipeline(t, func(c *config.Config) { c.Router.Messages.Unowned = unowned })
			tp.handle(t, begin(0x300))
			err := tp.Handle(&wal.Message{XID: 7, LSN: 0x200, Transactional: true, Prefix: "outbox", Content: []byte(content)})
			var poison *router.RowError
			if halted := errors.As(err, &poison); halted != (unowned == config.UnownedDeliver) {
				t.Errorf("unowned %s: content %s: %v", unowned, content, err)
			}
			if strings.Contains(content, "__outbox_table") && err != nil && !strings.Contains(err.Error(), "field __outbox_table is ") {
				t.Errorf("content %s: %v; want it to say the owner field is not a string", content, err)
			}
			if len(tp.prod.recs) != 0 {
				t.Errorf("unowned %s: content %s delivered %+v", unowned, content, tp.prod.recs)
			}
		}
	}
}

// An exactly-once replay of a split transaction skips the rows that the
// position says are in Kafka (position.Rows counts the delivered rows), so
// it must decide as the first run did which messages it delivers: whatever
// changed in the database meanwhile, the replay delivers exactly the rows
// after the split (review finding 1: with the owner read from the catalogue
// a replay could skip a row that never reached Kafka).
func TestPipelineReplayDecidesAlike(t *testing.T) {
	msg := func(lsn wal.LSN, id, owner string) *wal.Message {
		field := ""
		if owner != "" {
			field = `, "__outbox_table": "` + owner + `"`
		}
		return &wal.Message{XID: 7, LSN: lsn, Transactional: true, Prefix: "outbox",
			Content: []byte(`{"id": "` + id + `", "aggregate_type": "order", "aggregate_id": "k", "payload": {}` + field + `}`)}
	}
	items := []wal.Item{begin(0x300),
		msg(0x200, "m1", "public.outbox"), msg(0x208, "o1", "public.x"), msg(0x210, "u1", ""),
		msg(0x218, "m2", "public.outbox"), msg(0x220, "o2", "public.no_such_table"), msg(0x228, "m3", "outbox"), msg(0x230, "u2", "")}
	delivered := func(tp *testPipeline) []string {
		var ids []string
		for _, rec := range tp.prod.recs {
			ids = append(ids, header(rec, "id"))
		}
		return ids
	}
	first := newTestPipeline(t, nil)
	first.handle(t, items...)
	all := delivered(first)
	if want := []string{"m1", "u1", "m2", "m3", "u2"}; !slices.Equal(all, want) {
		t.Fatalf("first run delivered %v, want %v", all, want)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	kcfg := config.Default().Kafka
	kcfg.Brokers, kcfg.Delivery = c.ListenAddrs(), config.ExactlyOnce
	for rows := range len(all) + 1 {
		// The first run's Kafka transaction committed with rows of the
		// split transaction, then it stopped; this run replays it.
		producer, err := sink.NewTransactional(kcfg, sink.NewMetrics(prometheus.NewRegistry()), sink.NewTxnMetrics(prometheus.NewRegistry()),
			slog.New(slog.DiscardHandler), "replay")
		if err != nil {
			t.Fatal(err)
		}
		tp := newTestPipeline(t, nil)
		tp.eos = tp.newExactlyOnce(producer, "", 0, eos.Position{LSN: 0x100, Txn: 0x300, Rows: rows})
		tp.handle(t, items...)
		producer.Close()
		if got := delivered(tp); !slices.Equal(got, all[rows:]) {
			t.Errorf("replay after %d rows in Kafka delivered %v, want %v", rows, got, all[rows:])
		}
	}
}

// The owner package outbox writes is the one the pipeline checks: the
// messages of a Writer for public.orders_outbox are delivered by the outboxd
// of that table and left by the one of public.outbox.
func TestPipelineOwnerOfWriterMessages(t *testing.T) {
	if outbox.OwnerField != router.OwnerField {
		t.Fatalf("outbox.OwnerField %q, router.OwnerField %q: the writer and outboxd must agree", outbox.OwnerField, router.OwnerField)
	}
	w, err := outbox.New(outbox.Config{Table: "public.orders_outbox", Mode: outbox.Message})
	if err != nil {
		t.Fatal(err)
	}
	stmts, _, err := w.Statements(outbox.Event{AggregateType: "order", AggregateID: "42", Type: "OrderPlaced", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	msg := &wal.Message{XID: 7, LSN: 0x200, Transactional: true, Prefix: "outbox", Content: []byte(stmts[0].Args[0].(string))}
	for table, want := range map[string]int{"public.orders_outbox": 1, "public.outbox": 0} {
		tp := newTestPipeline(t, func(c *config.Config) { c.Postgres.Table = table })
		tp.handle(t, begin(0x300), msg, commit(0x310))
		if got := len(tp.prod.recs); got != want {
			t.Errorf("the outboxd of %s delivered %d of the writer's messages, want %d", table, got, want)
		}
	}
	// A writer whose Config.Table is left empty names no owner, as before
	// the owner existed: the outboxd that takes unowned messages delivers
	// them, whatever its table (the upgrade of a writer beside an outboxd
	// of another table than public.outbox), and one that ignores them does
	// not.
	w, err = outbox.New(outbox.Config{Mode: outbox.Message})
	if err != nil {
		t.Fatal(err)
	}
	if stmts, _, err = w.Statements(outbox.Event{AggregateType: "order", AggregateID: "42", Type: "OrderPlaced", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	msg = &wal.Message{XID: 7, LSN: 0x200, Transactional: true, Prefix: "outbox", Content: []byte(stmts[0].Args[0].(string))}
	for unowned, want := range map[config.Unowned]int{config.UnownedDeliver: 1, config.UnownedIgnore: 0} {
		tp := newTestPipeline(t, func(c *config.Config) { c.Postgres.Table, c.Router.Messages.Unowned = "app.events", unowned })
		tp.handle(t, begin(0x300), msg, commit(0x310))
		if got := len(tp.prod.recs); got != want {
			t.Errorf("the outboxd of app.events with unowned %s delivered %d messages of a writer without Config.Table, want %d", unowned, got, want)
		}
	}
}
