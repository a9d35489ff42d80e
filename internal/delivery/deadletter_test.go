package delivery

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/dlq"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/wal"
)

// A row that routing refused after its topic was known (here a NULL key
// with require_key; also key_encoding string, a partition column, the
// headers column, the timestamp column, expand_json_payload) is
// dead-lettered with its key and payload columns and only the id and event
// type headers: not the record outboxd would have sent. The dead letter says
// so, and redrive leaves it to outboxd replay; one whose record was built
// and then refused by Kafka or the producer stays redrivable.
func TestRoutingFailureDeadLetterIsNotRedrivable(t *testing.T) {
	cfg := config.Default()
	cfg.Router.Poison.Policy, cfg.Router.Poison.DLQTopic = config.PoisonDLQ, "dlq"
	letter := func(p *router.RowError) *dlq.Letter {
		rec := DeadLetter(cfg, p)
		kr := &kgo.Record{Key: rec.Key, Value: rec.Value}
		for _, h := range rec.Headers {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		return dlq.Build("dlq", dlq.FallbackOf(cfg), []*kgo.Record{kr}).Letters[0]
	}
	l := letter(&router.RowError{EventID: "e1", Table: "public.outbox", Topic: "orders-events",
		Reason: "column aggregateid is NULL; a key is required (router.require_key)", Value: []byte(`{"a":1}`), EventType: "Placed"})
	if l.NotRedrivable == "" {
		var keys []string
		for _, h := range l.Headers {
			keys = append(keys, h.Key)
		}
		t.Errorf("a row refused by routing is redrivable: it would go to %s with key %q and headers %v", l.Topic, l.Key, keys)
	}
	l = letter(&router.RowError{EventID: "e2", Table: "public.outbox", Topic: "orders-events", Reason: "MESSAGE_TOO_LARGE",
		Key: []byte("k"), Value: []byte(`{"a":2}`), Headers: []router.Header{{Key: cfg.Router.IDHeader, Value: []byte("e2")}}})
	if l.NotRedrivable != "" {
		t.Errorf("a built record Kafka refused is not redrivable: %s", l.NotRedrivable)
	}
}

// Issue 35 §1: each outbox table takes its own poison policy, dead-letter
// topic and id and event type headers. A row refused in one table goes to
// that table's dead-letter topic (or halts, where the table halts), and its
// dead letter records its table's header names, which internal/dlq reads
// back whatever the top-level router says.
func TestPipelinePoisonPerTable(t *testing.T) {
	var entries []config.TableEntry
	if err := yaml.Unmarshal([]byte(`
- public.outbox
- {name: orders.outbox, router: {id_header: eventId, event_type_header: kind, poison: {dlq_topic: orders-dlq}}}
- {name: wallet.outbox, router: {poison: {policy: halt}}}
`), &entries); err != nil {
		t.Fatal(err)
	}
	tp := newTestPipeline(t, func(c *config.Config) {
		c.Postgres.Table, c.Postgres.Tables = "", entries
		c.Router.Messages.Unowned = config.UnownedIgnore
		c.Router.Poison = config.Poison{Policy: config.PoisonDLQ, DLQTopic: "dlq"}
	})
	tp.prod.refuse = func(rec *router.Record) error {
		if strings.HasSuffix(rec.Topic, "dlq") {
			return nil
		}
		return &router.RowError{EventID: rec.EventID, Topic: rec.Topic, Key: rec.Key, Value: rec.Value, Reason: "over kafka.max_message_bytes"}
	}
	of := func(schema string, id uint32, lsn wal.LSN, eventID string) *wal.Change {
		rel := *outboxRel
		rel.ID, rel.Namespace = id, schema
		ch := change(wal.Insert, lsn, eventID, "o-1", `{"n": 1}`)
		ch.Relation = &rel
		return ch
	}
	tp.handle(t, begin(0x200), of("public", 16400, 0x180, id1), of("orders", 16500, 0x188, id2), commit(0x210))
	want := []struct{ topic, idHeader, typeHeader, id string }{{"dlq", "id", "eventType", id1}, {"orders-dlq", "eventId", "kind", id2}}
	if len(tp.prod.recs) != len(want) {
		t.Fatalf("%d records handed over, want the two dead letters", len(tp.prod.recs))
	}
	for i, w := range want {
		rec := tp.prod.recs[i]
		kr := &kgo.Record{Key: rec.Key, Value: rec.Value}
		for _, h := range rec.Headers {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		l := dlq.Build(rec.Topic, dlq.FallbackOf(config.Default()), []*kgo.Record{kr}).Letters[0]
		if rec.Topic != w.topic || l.EventID != w.id || l.Names != (dlq.Names{ID: w.idHeader, EventType: w.typeHeader}) || l.EventType != "OrderCreated" || l.NotRedrivable != "" {
			t.Errorf("dead letter %d: topic %s, read back as id %q type %q under %+v (%s); want %s, %s under %s and %s, redrivable",
				i, rec.Topic, l.EventID, l.EventType, l.Names, l.NotRedrivable, w.topic, w.id, w.idHeader, w.typeHeader)
		}
	}
	for _, table := range []string{"public.outbox", "orders.outbox"} {
		if got := testutil.ToFloat64(tp.m.deadLettered.WithLabelValues(table)); got != 1 {
			t.Errorf("outboxd_router_dead_lettered_total{table=%q} = %v, want 1", table, got)
		}
	}
	tp.prod.ackAll(nil)
	if got := tp.tracker.Confirmed(); got != 0x210 {
		t.Errorf("confirmed %s after the dead letters' acknowledgements, want 0/210", got)
	}
	// wallet.outbox halts, though the top-level policy is dlq.
	tp.handle(t, begin(0x300))
	err := tp.Handle(of("wallet", 16600, 0x280, id1))
	var rowErr *router.RowError
	if !errors.As(err, &rowErr) || len(tp.prod.recs) != 2 {
		t.Errorf("a refused row of wallet.outbox (policy halt): Handle = %v, %d records handed over; want the row's error and no dead letter", err, len(tp.prod.recs))
	}
	// The error names the table and the entry whose setting decided, and
	// the hint points at that entry, not at the top-level router (dlq).
	if msg := err.Error(); !strings.Contains(msg, "router.poison.policy of table wallet.outbox is halt, set by postgres.tables[2] (wallet.outbox)") {
		t.Errorf("halt error %q: want it to name wallet.outbox and postgres.tables[2], whose policy halt decided", msg)
	}
	if h := hintOf(err); !strings.Contains(h, "router.poison.policy: dlq (and router.poison.dlq_topic) in postgres.tables[2] (wallet.outbox) and restart") {
		t.Errorf("halt hint %q: want it to point at postgres.tables[2] (wallet.outbox)", h)
	}
}
