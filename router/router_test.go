package router_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/golden"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/wal"
)

// Type OIDs used in the tests.
const (
	oidBytea = 17
	oidText  = 25
	oidUUID  = 2950
	oidJSONB = 3802
)

// table builds a relation and rows for it by column name.
type table struct{ rel *wal.Relation }

func newTable(cols ...wal.Column) table {
	return table{rel: &wal.Relation{ID: 16384, Namespace: "public", Name: "outbox", Columns: cols}}
}

// outbox is the default outbox table; payload is jsonb.
func outbox() table {
	return newTable(
		wal.Column{Name: "id", TypeOID: oidUUID, Key: true},
		wal.Column{Name: "aggregate_type", TypeOID: oidText},
		wal.Column{Name: "aggregate_id", TypeOID: oidText},
		wal.Column{Name: "event_type", TypeOID: oidText},
		wal.Column{Name: "payload", TypeOID: oidJSONB},
	)
}

// val is a column value: a *string (nil for NULL) or a wal.Datum.
type row map[string]any

func s(v string) *string { return &v }

// change builds an insert of r; unmentioned columns are NULL.
func (tb table) change(lsn wal.LSN, r row) *wal.Change {
	tuple := make([]wal.Datum, len(tb.rel.Columns))
	for i, c := range tb.rel.Columns {
		switch v := r[c.Name].(type) {
		case nil:
			tuple[i] = wal.Datum{Kind: wal.DatumNull}
		case *string:
			if v == nil {
				tuple[i] = wal.Datum{Kind: wal.DatumNull}
			} else {
				tuple[i] = wal.Datum{Kind: wal.DatumText, Data: []byte(*v)}
			}
		case wal.Datum:
			tuple[i] = v
		default:
			panic(fmt.Sprintf("column %s: unsupported value %T", c.Name, v))
		}
	}
	return &wal.Change{Op: wal.Insert, XID: 7, LSN: lsn, Relation: tb.rel, Tuple: tuple}
}

func defaultRow() row {
	return row{
		"id":             s("7f1c2a9e-2b8e-4c55-9d3e-2a1f0c9b8e01"),
		"aggregate_type": s("order"),
		"aggregate_id":   s("o-42"),
		"event_type":     s("OrderCreated"),
		"payload":        s(`{"a": 1, "b": [1, 2]}`),
	}
}

func with(r row, kv ...any) row {
	out := row{}
	for k, v := range r {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

func TestRouteGolden(t *testing.T) {
	def := config.Default().Router
	debezium := config.Router{
		TopicTemplate: "outbox.event.${routedByValue}", RouteByColumn: "aggregatetype", IDColumn: "id",
		KeyColumn: "aggregateid", PayloadColumn: "payload", EventTypeColumn: "type",
		IDHeader: "id", EventTypeHeader: "eventType",
	}
	debeziumTable := newTable(
		wal.Column{Name: "id", TypeOID: oidUUID, Key: true},
		wal.Column{Name: "aggregatetype", TypeOID: oidText},
		wal.Column{Name: "aggregateid", TypeOID: oidText},
		wal.Column{Name: "type", TypeOID: oidText},
		wal.Column{Name: "payload", TypeOID: oidJSONB},
	)
	byteaTable := newTable(
		wal.Column{Name: "id", TypeOID: oidUUID, Key: true},
		wal.Column{Name: "aggregate_type", TypeOID: oidText},
		wal.Column{Name: "aggregate_id", TypeOID: oidText},
		wal.Column{Name: "event_type", TypeOID: oidText},
		wal.Column{Name: "payload", TypeOID: oidBytea},
	)
	reordered := newTable(
		wal.Column{Name: "created_at", TypeOID: 1184},
		wal.Column{Name: "payload", TypeOID: oidJSONB},
		wal.Column{Name: "event_type", TypeOID: oidText},
		wal.Column{Name: "aggregate_id", TypeOID: oidText},
		wal.Column{Name: "tenant", TypeOID: oidText},
		wal.Column{Name: "aggregate_type", TypeOID: oidText},
		wal.Column{Name: "id", TypeOID: oidUUID, Key: true},
	)
	noEventType := newTable(outbox().rel.Columns[0], outbox().rel.Columns[1], outbox().rel.Columns[2], outbox().rel.Columns[4])
	noKey := newTable(outbox().rel.Columns[0], outbox().rel.Columns[1], outbox().rel.Columns[3], outbox().rel.Columns[4])
	bare := newTable(wal.Column{Name: "id", TypeOID: oidUUID})

	cfg := func(mod func(*config.Router)) config.Router {
		c := def
		mod(&c)
		return c
	}
	tests := []struct {
		name   string
		cfg    config.Router
		change *wal.Change
	}{
		{"default", def, outbox().change(0x1000, defaultRow())},
		{"jsonb_byte_for_byte", def, outbox().change(0x1000, with(defaultRow(), "payload", s("{\"k\":   \"v\\u00e9\",\n \"n\": 1.50}")))},
		{"bytea_payload", def, byteaTable.change(0x1000, with(defaultRow(), "payload", s(`\x00ff0a7b7d`)))},
		{"binary_datum_payload", def, outbox().change(0x1000, with(defaultRow(), "payload", wal.Datum{Kind: wal.DatumBinary, Data: []byte{1, 0, 2}}))},
		{"null_key", cfg(func(c *config.Router) { c.RequireKey = false }), outbox().change(0x1000, with(defaultRow(), "aggregate_id", nil))},
		{"error_null_key_required", def, outbox().change(0x2000, with(defaultRow(), "aggregate_id", nil))},
		{"empty_key", def, outbox().change(0x1000, with(defaultRow(), "aggregate_id", s("")))},
		{"null_payload", def, outbox().change(0x1000, with(defaultRow(), "payload", nil))},
		{"empty_payload", def, outbox().change(0x1000, with(defaultRow(), "payload", s("")))},
		{"null_event_type", def, outbox().change(0x1000, with(defaultRow(), "event_type", nil))},
		{"event_type_column_unset", cfg(func(c *config.Router) { c.EventTypeColumn = "" }), noEventType.change(0x1000, defaultRow())},
		{"event_type_column_unset_but_present", cfg(func(c *config.Router) { c.EventTypeColumn = "" }), outbox().change(0x1000, defaultRow())},
		{"custom_headers", cfg(func(c *config.Router) { c.IDHeader, c.EventTypeHeader = "ce_id", "ce_type" }), outbox().change(0x1000, defaultRow())},
		{"template_without_placeholder", cfg(func(c *config.Router) { c.TopicTemplate = "outbox.all" }), outbox().change(0x1000, defaultRow())},
		{"template_placeholder_twice", cfg(func(c *config.Router) { c.TopicTemplate = "${routedByValue}.${routedByValue}" }), outbox().change(0x1000, defaultRow())},
		{"template_prefix", cfg(func(c *config.Router) { c.TopicTemplate = "prod.${routedByValue}" }), outbox().change(0x1000, defaultRow())},
		{"template_placeholder_only", cfg(func(c *config.Router) { c.TopicTemplate = "${routedByValue}" }), outbox().change(0x1000, defaultRow())},
		{"debezium_columns", debezium, debeziumTable.change(0x1000, row{
			"id": s("e-1"), "aggregatetype": s("Customer"), "aggregateid": s("c_9"), "type": s("CustomerCreated"), "payload": s(`{"name": "Ada"}`),
		})},
		{"key_column_is_route_column", cfg(func(c *config.Router) { c.KeyColumn = "aggregate_type" }), outbox().change(0x1000, defaultRow())},
		{"columns_in_other_order", def, reordered.change(0x1000, with(defaultRow(), "tenant", s("t1"), "created_at", s("2024-05-17 09:30:15+00")))},
		{"topic_249_characters", def, outbox().change(0x1000, with(defaultRow(), "aggregate_type", s(strings.Repeat("x", 249-len("-events")))))},
		{"topic_allowed_characters", def, outbox().change(0x1000, with(defaultRow(), "aggregate_type", s("Az09._-")))},

		// Rows that cannot be routed.
		{"error_null_route_by", def, outbox().change(0x2000, with(defaultRow(), "aggregate_type", nil))},
		{"error_space_in_topic", def, outbox().change(0x2000, with(defaultRow(), "aggregate_type", s("a b")))},
		{"error_non_ascii_topic", def, outbox().change(0x2000, with(defaultRow(), "aggregate_type", s("ä")))},
		{"error_slash_in_topic", def, outbox().change(0x2000, with(defaultRow(), "aggregate_type", s("a/b")))},
		{"error_topic_250_characters", def, outbox().change(0x2000, with(defaultRow(), "aggregate_type", s(strings.Repeat("x", 250-len("-events")))))},
		{"error_topic_dot", cfg(func(c *config.Router) { c.TopicTemplate = "${routedByValue}" }), outbox().change(0x2000, with(defaultRow(), "aggregate_type", s(".")))},
		{"error_topic_dotdot", cfg(func(c *config.Router) { c.TopicTemplate = "${routedByValue}" }), outbox().change(0x2000, with(defaultRow(), "aggregate_type", s("..")))},
		{"error_topic_empty", cfg(func(c *config.Router) { c.TopicTemplate = "${routedByValue}" }), outbox().change(0x2000, with(defaultRow(), "aggregate_type", s("")))},
		{"error_missing_event_type_column", def, noEventType.change(0x2000, defaultRow())},
		{"error_missing_key_column", def, noKey.change(0x2000, defaultRow())},
		{"error_missing_many_columns", def, bare.change(0x2000, defaultRow())},
		{"error_unchanged_toast_payload", def, outbox().change(0x2000, with(defaultRow(), "payload", wal.Datum{Kind: wal.DatumUnchanged}))},
		{"error_bad_bytea_payload", def, byteaTable.change(0x2000, with(defaultRow(), "payload", s(`not hex`)))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := router.New(tt.cfg, router.Schema{})
			if err != nil {
				t.Fatal(err)
			}
			rec, err := r.Route(tt.change)
			var got string
			if err != nil {
				if rec != nil {
					t.Errorf("Route returned a record along with error %v", err)
				}
				var le *router.LayoutError
				if errors.As(err, &le) {
					if !strings.HasPrefix(tt.name, "error_missing_") {
						t.Errorf("unexpected layout error: %v", err)
					}
					golden.Check(t, filepath.Join("testdata", tt.name+".golden"), "layout error: "+le.Error()+"\n")
					return
				}
				var re *router.RowError
				if !errors.As(err, &re) {
					t.Fatalf("Route error %T %v, want *router.RowError", err, err)
				}
				if re.LSN != tt.change.LSN {
					t.Errorf("RowError.LSN = %s, want %s", re.LSN, tt.change.LSN)
				}
				if re.Table != "public.outbox" {
					t.Errorf("RowError.Table = %q, want public.outbox", re.Table)
				}
				if !strings.HasPrefix(tt.name, "error_") {
					t.Errorf("unexpected error: %v", err)
				}
				got = fmt.Sprintf("error event_id=%q lsn=%s table=%s\nreason: %s\nmessage: %s\n", re.EventID, re.LSN, re.Table, re.Reason, re.Error())
			} else {
				if strings.HasPrefix(tt.name, "error_") {
					t.Errorf("Route succeeded, want a *router.RowError")
				}
				got = renderRecord(rec)
			}
			golden.Check(t, filepath.Join("testdata", tt.name+".golden"), got)
		})
	}
}

func renderRecord(rec *router.Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "topic:    %s\n", rec.Topic)
	if rec.Partition >= 0 {
		fmt.Fprintf(&b, "partition: %d\n", rec.Partition)
	}
	if !rec.Timestamp.IsZero() {
		fmt.Fprintf(&b, "timestamp: %s\n", rec.Timestamp.Format(time.RFC3339Nano))
	}
	fmt.Fprintf(&b, "key:      %s\n", quote(rec.Key))
	fmt.Fprintf(&b, "value:    %s\n", quote(rec.Value))
	fmt.Fprintf(&b, "event_id: %q\n", rec.EventID)
	for _, h := range rec.Headers {
		fmt.Fprintf(&b, "header:   %s = %s\n", h.Key, quote(h.Value))
	}
	return b.String()
}

// quote shows nil apart from empty, and every non-printable byte as \xNN.
func quote(v []byte) string {
	if v == nil {
		return "nil"
	}
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range v {
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c >= 0x20 && c < 0x7f:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "\\x%02x", c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// TestRouteExact pins the contract independently of the golden files.
func TestRouteExact(t *testing.T) {
	cfg := config.Default().Router
	cfg.RequireKey = false
	r, err := router.New(cfg, router.Schema{})
	if err != nil {
		t.Fatal(err)
	}
	payload := `{"a": 1, "b": [1, 2]}`
	rec, err := r.Route(outbox().change(0x10, with(defaultRow(), "payload", s(payload))))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Topic != "order-events" {
		t.Errorf("topic = %q, want order-events", rec.Topic)
	}
	if string(rec.Key) != "o-42" {
		t.Errorf("key = %q, want o-42", rec.Key)
	}
	if string(rec.Value) != payload {
		t.Errorf("value = %q, want %q", rec.Value, payload)
	}
	if rec.EventID != "7f1c2a9e-2b8e-4c55-9d3e-2a1f0c9b8e01" {
		t.Errorf("event id = %q", rec.EventID)
	}
	want := []router.Header{{"id", []byte("7f1c2a9e-2b8e-4c55-9d3e-2a1f0c9b8e01")}, {"eventType", []byte("OrderCreated")}}
	if fmt.Sprintf("%q", rec.Headers) != fmt.Sprintf("%q", want) {
		t.Errorf("headers = %q, want %q", rec.Headers, want)
	}

	rec, err = r.Route(outbox().change(0x10, with(defaultRow(), "aggregate_id", nil, "payload", nil, "event_type", nil)))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Key != nil || rec.Value != nil {
		t.Errorf("NULL key and payload gave key %#v, value %#v; want nil, nil", rec.Key, rec.Value)
	}
	if len(rec.Headers) != 2 || rec.Headers[0].Key != "id" || rec.Headers[1].Key != "eventType" || rec.Headers[1].Value != nil {
		t.Errorf("NULL event type gave headers %q, want id and eventType without a value (as Debezium's header placement)", rec.Headers)
	}

	rec, err = r.Route(outbox().change(0x10, with(defaultRow(), "payload", s(""))))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Value == nil || len(rec.Value) != 0 {
		t.Errorf("empty payload gave value %#v, want an empty non-nil value (nil is a tombstone)", rec.Value)
	}
}

// TestRouteRowErrorFields checks the fields callers branch on.
func TestRouteRowErrorFields(t *testing.T) {
	r, err := router.New(config.Default().Router, router.Schema{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Route(outbox().change(0x16B3748, with(defaultRow(), "id", s("ev-1"), "aggregate_type", s("a b"))))
	var re *router.RowError
	if !errors.As(err, &re) {
		t.Fatalf("got %v, want *router.RowError", err)
	}
	if re.EventID != "ev-1" || re.LSN != 0x16B3748 || re.Table != "public.outbox" {
		t.Errorf("RowError = %+v", re)
	}
	for _, want := range []string{"ev-1", "0/16B3748", "public.outbox", `"a b-events"`, "aggregate_type"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}

	_, err = r.Route(newTable(wal.Column{Name: "id"}).change(0x20, row{"id": s("ev-2")}))
	var le *router.LayoutError
	if !errors.As(err, &le) {
		t.Fatalf("got %v, want *router.LayoutError", err)
	}
	if !strings.Contains(err.Error(), "aggregate_type, aggregate_id, payload, event_type") {
		t.Errorf("missing-column error = %q", err)
	}
}

// TestRouteNewRelation checks that the router recomputes its column layout
// for a new *wal.Relation (after ALTER TABLE), and again when handed an older
// one.
func TestRouteNewRelation(t *testing.T) {
	r, err := router.New(config.Default().Router, router.Schema{})
	if err != nil {
		t.Fatal(err)
	}
	before := outbox()
	after := newTable( // ALTER TABLE: columns reordered and one added
		wal.Column{Name: "payload", TypeOID: oidJSONB},
		wal.Column{Name: "id", TypeOID: oidUUID, Key: true},
		wal.Column{Name: "trace", TypeOID: oidText},
		wal.Column{Name: "event_type", TypeOID: oidText},
		wal.Column{Name: "aggregate_id", TypeOID: oidText},
		wal.Column{Name: "aggregate_type", TypeOID: oidText},
	)
	broken := newTable(before.rel.Columns[:3]...) // payload and event_type dropped

	routeOK := func(tb table, typ string) {
		t.Helper()
		rec, err := r.Route(tb.change(0x10, with(defaultRow(), "aggregate_type", s(typ), "trace", s("tr"))))
		if err != nil {
			t.Fatal(err)
		}
		if want := typ + "-events"; rec.Topic != want || string(rec.Key) != "o-42" || string(rec.Value) != `{"a": 1, "b": [1, 2]}` {
			t.Fatalf("got topic %q key %q value %q, want %s, o-42 and the payload", rec.Topic, rec.Key, rec.Value, want)
		}
	}
	routeOK(before, "first")
	routeOK(after, "second")
	routeOK(after, "third")
	if _, err := r.Route(broken.change(0x10, defaultRow())); err == nil {
		t.Fatal("routed a row of a relation without payload")
	}
	routeOK(after, "fourth") // a failed relation must not replace the cached layout
	routeOK(before, "fifth") // in-flight changes of the older relation
}

func TestNew(t *testing.T) {
	c := config.Default().Router
	c.TopicTemplate = ""
	if _, err := router.New(c, router.Schema{}); err == nil {
		t.Error("New accepted an empty topic template")
	}
	if got, want := strings.Join(router.Columns(config.Default().Router), ","), "id,aggregate_type,aggregate_id,payload,event_type"; got != want {
		t.Errorf("Columns() = %s, want %s", got, want)
	}
	c = config.Default().Router
	c.EventTypeColumn = ""
	if got, want := strings.Join(router.Columns(c), ","), "id,aggregate_type,aggregate_id,payload"; got != want {
		t.Errorf("Columns() without event type = %s, want %s", got, want)
	}
}

func BenchmarkRoute(b *testing.B) {
	r, err := router.New(config.Default().Router, router.Schema{})
	if err != nil {
		b.Fatal(err)
	}
	c := outbox().change(0x10, with(defaultRow(), "payload", s(`{"orderId": "o-42", "lines": [{"sku": "A-1", "qty": 2}], "total": "19.90"}`)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Route(c); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRouteBadCharacterNamed requires the topic error to name the character
// the user wrote, not one byte of its UTF-8 encoding.
func TestRouteBadCharacterNamed(t *testing.T) {
	r, err := router.New(config.Default().Router, router.Schema{})
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"ä", "a✓b", "日本"} {
		_, err := r.Route(outbox().change(0x10, with(defaultRow(), "aggregate_type", s(typ))))
		if err == nil {
			t.Fatalf("routed aggregate_type %q", typ)
		}
		bad := []rune(strings.TrimLeft(typ, "ab"))[0]
		if want := fmt.Sprintf("character %q", bad); !strings.Contains(err.Error(), want) {
			t.Errorf("aggregate_type %q: error %q does not contain %s", typ, err, want)
		}
	}
}

// TestRouteIntoReusedRecord routes a row with a key, a payload, an event
// type and a partition column, then one with all of them NULL, into the
// same record, as the relay does: nothing of the first may remain.
func TestRouteIntoReusedRecord(t *testing.T) {
	cfg := config.Default().Router
	cfg.RequireKey = false
	cfg.AdditionalFields = []config.Field{{Column: "part", Placement: "partition"}, {Column: "tenant", Placement: "header"}}
	r, err := router.New(cfg, router.Schema{})
	if err != nil {
		t.Fatal(err)
	}
	tb := outbox()
	tb.rel.Columns = append(tb.rel.Columns, wal.Column{Name: "part", TypeOID: oidText}, wal.Column{Name: "tenant", TypeOID: oidText})
	var rec router.Record
	if err := r.RouteInto(tb.change(0x10, with(defaultRow(), "part", s("3"), "tenant", s("t1"))), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Partition != 3 || len(rec.Headers) != 3 || rec.Key == nil || rec.Value == nil {
		t.Fatalf("first row: partition %d, headers %q, key %q, value %q", rec.Partition, rec.Headers, rec.Key, rec.Value)
	}
	second := with(defaultRow(), "id", s("second"), "aggregate_id", nil, "payload", nil, "event_type", nil)
	if err := r.RouteInto(tb.change(0x20, second), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.EventID != "second" || rec.Key != nil || rec.Value != nil || rec.Partition != -1 ||
		len(rec.Headers) != 3 || rec.Headers[0].Key != "id" || string(rec.Headers[0].Value) != "second" ||
		rec.Headers[1].Value != nil || rec.Headers[2].Value != nil {
		t.Errorf("second row kept parts of the first: event id %q, key %q, value %q, partition %d, headers %q",
			rec.EventID, rec.Key, rec.Value, rec.Partition, rec.Headers)
	}
}
