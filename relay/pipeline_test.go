package relay

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/router"
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
	r       *Relay
	prod    *fakeProducer
	tracker *checkpoint.Tracker
	run     context.Context // ends, with the failure as its cause, when a record fails
}

func newTestPipeline(t *testing.T, tune func(*config.Config)) *testPipeline {
	t.Helper()
	cfg := config.Default()
	if tune != nil {
		tune(&cfg)
	}
	r, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	run, fail := context.WithCancelCause(context.Background())
	t.Cleanup(func() { fail(nil) })
	prod := &fakeProducer{}
	tracker := checkpoint.New(0x100)
	p := r.NewPipeline(run, tracker, prod, fail, 0)
	t.Cleanup(p.Close)
	return &testPipeline{Pipeline: p, r: r, prod: prod, tracker: tracker, run: run}
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
		if got := testutil.ToFloat64(tp.r.m.changes.WithLabelValues(op)); got != want {
			t.Errorf("outboxd_wal_changes_total{op=%q} = %v, want %v", op, got, want)
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
			if !errors.As(err, &rowErr) || !strings.Contains(err.Error(), tc.reason) || !strings.Contains(err.Error(), "router.poison.policy: dlq") {
				t.Fatalf("Handle = %v, want the row's error naming %q and the dlq policy", err, tc.reason)
			}
			if !IsPermanent(err) {
				t.Errorf("IsPermanent(%v) = false: a restart meets the same row", err)
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
			if got := testutil.ToFloat64(tp.r.m.deadLettered); got != 1 {
				t.Errorf("outboxd_router_dead_lettered_total = %v, want 1", got)
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
			case tc.stops && (!errors.Is(err, errUpdate) || !IsPermanent(err)):
				t.Errorf("Handle = %v, want the permanent errUpdate", err)
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
// names (router.OwnerField), and one that names none by the deployment with
// router.messages.unowned: deliver only; one that names a table no other
// publication lists (one the database lacks, say) is taken as naming none
// (issue 32 item 12).
func TestPipelineDeliversOnlyItsOwnMessages(t *testing.T) {
	msg := func(owner string) *wal.Message {
		field := ""
		if owner != "" {
			field = `, "__outbox_table": ` + owner
		}
		return &wal.Message{XID: 7, LSN: 0x200, Transactional: true, Prefix: "outbox",
			Content: []byte(`{"id": "m", "aggregate_type": "order", "aggregate_id": "k", "payload": {}` + field + `}`)}
	}
	for _, tc := range []struct {
		name    string
		unowned config.Unowned
		owner   string // the field's JSON value, "" for no field
		want    bool
	}{
		{"its own", config.UnownedIgnore, `"public.outbox"`, true},
		{"its own, unqualified", config.UnownedIgnore, `"outbox"`, true},
		{"its own, taking the unowned", config.UnownedDeliver, `"public.outbox"`, true},
		{"another deployment's", config.UnownedDeliver, `"public.orders_outbox"`, false},
		{"another deployment's, unqualified", config.UnownedDeliver, `"orders_outbox"`, false},
		{"unowned, taken", config.UnownedDeliver, "", true},
		{"unowned, left", config.UnownedIgnore, "", false},
		{"owner null, taken", config.UnownedDeliver, "null", true},
		{"owner null, left", config.UnownedIgnore, "null", false},
		{"a table nothing else streams, taken", config.UnownedDeliver, `"public.no_such_table"`, true},
		{"a table nothing else streams, left", config.UnownedIgnore, `"public.no_such_table"`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := newTestPipeline(t, func(c *config.Config) { c.Router.Messages.Unowned = tc.unowned })
			// What the catalog lookup would have found.
			tp.owners.others["public.orders_outbox"] = otherOwner{streamed: true, at: time.Now()}
			tp.owners.others["public.no_such_table"] = otherOwner{streamed: false, at: time.Now()}
			tp.handle(t, begin(0x300), msg(tc.owner), commit(0x310))
			if got := len(tp.prod.recs) == 1; got != tc.want {
				t.Fatalf("delivered %v, want %v", got, tc.want)
			}
			if tc.want && header(tp.prod.recs[0], "id") != "m" {
				t.Errorf("delivered %+v", tp.prod.recs[0])
			}
			tp.prod.ackAll(nil)
			if got := tp.tracker.Confirmed(); got != 0x310 {
				t.Errorf("confirmed %s, want 0/310: a message left to another deployment is confirmed past", got)
			}
			left := testutil.ToFloat64(tp.r.m.changes.WithLabelValues("message_other_outbox"))
			if want := map[bool]float64{true: 0, false: 1}[tc.want]; left != want {
				t.Errorf("outboxd_wal_changes_total{op=\"message_other_outbox\"} = %v, want %v", left, want)
			}
		})
	}
	// Content that is not a JSON object names no owner: the deployment that
	// takes unowned messages halts on it, the others leave it.
	for _, unowned := range []config.Unowned{config.UnownedDeliver, config.UnownedIgnore} {
		tp := newTestPipeline(t, func(c *config.Config) { c.Router.Messages.Unowned = unowned })
		tp.handle(t, begin(0x300))
		err := tp.Handle(&wal.Message{XID: 7, LSN: 0x200, Transactional: true, Prefix: "outbox", Content: []byte("not json")})
		var poison *router.RowError
		if halted := errors.As(err, &poison); halted != (unowned == config.UnownedDeliver) {
			t.Errorf("unowned %s: content not JSON: %v", unowned, err)
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
		tp.owners.others["public.orders_outbox"] = otherOwner{streamed: true, at: time.Now()} // what the catalog lookup finds
		tp.handle(t, begin(0x300), msg, commit(0x310))
		if got := len(tp.prod.recs); got != want {
			t.Errorf("the outboxd of %s delivered %d of the writer's messages, want %d", table, got, want)
		}
	}
}
