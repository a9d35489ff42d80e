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
