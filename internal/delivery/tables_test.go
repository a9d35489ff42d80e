package delivery

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/wal"
)

// Several outbox tables: each change and each message is routed by its own
// table's settings, a renamed table by its relation ID, and each table's
// router.on_update applies to its own updates.
func TestPipelineRoutesByTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outboxd.yaml")
	yaml := `postgres:
  tables:
    - public.outbox
    - name: orders.events
      router: {id_column: event_id, route_by_column: stream, key_column: stream_no, event_type_column: kind, payload_column: body,
               topic_template: 'orders.${routedByValue}', on_update: error}
router:
  messages: {unowned: ignore}
`
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := setupOf(cfg, slog.New(slog.DiscardHandler))
	s.OutboxIDs = []uint32{16400, 16500}
	tp := newTestPipelineOf(t, s)
	prod := tp.prod

	events := &wal.Relation{ID: 16500, Namespace: "orders", Name: "events", Columns: []wal.Column{
		{Name: "event_id", TypeOID: 2950, Key: true}, {Name: "stream", TypeOID: 25}, {Name: "stream_no", TypeOID: 20},
		{Name: "kind", TypeOID: 25}, {Name: "body", TypeOID: 3802}}}
	renamed := *events
	renamed.Name = "events_old" // renamed while outboxd ran: known by its relation ID
	text := func(s string) wal.Datum { return wal.Datum{Kind: wal.DatumText, Data: []byte(s)} }
	row := func(rel *wal.Relation, op wal.Op, lsn wal.LSN, id string) *wal.Change {
		return &wal.Change{Op: op, XID: 7, LSN: lsn, CommitTime: commitTime, Relation: rel,
			Tuple: []wal.Datum{text(id), text("payment"), text("42"), text("Paid"), text(`{"n": 1}`)}}
	}
	msg := func(lsn wal.LSN, content string) *wal.Message {
		return &wal.Message{XID: 7, LSN: lsn, Transactional: true, Prefix: "outbox", Content: []byte(content)}
	}
	const id3, id4 = "7f1c2a9e-2b8e-4c55-9d3e-2a1f0c9b8e03", "7f1c2a9e-2b8e-4c55-9d3e-2a1f0c9b8e04"
	tp.handle(t, begin(0x300),
		change(wal.Insert, 0x180, id1, "o-1", `{"n": 1}`),
		row(events, wal.Insert, 0x188, id2),
		change(wal.Update, 0x190, id1, "o-1", `{"n": 1}`), // public.outbox: on_update warn
		row(&renamed, wal.Insert, 0x198, id3),
		msg(0x1a0, `{"__outbox_table": "orders.events", "event_id": "`+id4+`", "stream": "refund", "stream_no": 7, "kind": "Refunded", "body": {}}`),
		msg(0x1a8, `{"__outbox_table": "public.outbox", "id": "`+id1+`", "aggregate_type": "order", "aggregate_id": "o-2", "event_type": "E", "payload": {}}`),
		msg(0x1b0, `{"__outbox_table": "other.outbox", "id": "`+id1+`", "aggregate_type": "order", "aggregate_id": "o-3", "event_type": "E", "payload": {}}`),
		msg(0x1b8, `{"id": "`+id1+`", "aggregate_type": "order", "aggregate_id": "o-4", "event_type": "E", "payload": {}}`),
		commit(0x310))
	want := []struct{ topic, key, id string }{
		{"order-events", "o-1", id1}, {"orders.payment", "42", id2}, {"orders.payment", "42", id3},
		{"orders.refund", "7", id4}, {"order-events", "o-2", id1},
	}
	if len(prod.recs) != len(want) {
		t.Fatalf("%d records, want %d", len(prod.recs), len(want))
	}
	for i, w := range want {
		rec := prod.recs[i]
		if rec.Topic != w.topic || string(rec.Key) != w.key || header(rec, "id") != w.id {
			t.Errorf("record %d: topic %s key %s id %s; want %s, %s, %s", i, rec.Topic, rec.Key, header(rec, "id"), w.topic, w.key, w.id)
		}
	}
	// orders.events' own on_update: error.
	tp.handle(t, begin(0x400))
	err = tp.Handle(row(events, wal.Update, 0x380, id2))
	if !errors.Is(err, ErrUpdate) {
		t.Errorf("update of orders.events (on_update: error there): %v, want ErrUpdate", err)
	}
}
