package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/outbox"
)

func ptr[T any](v T) *T { return &v }

func TestNewRejects(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  outbox.Config
		want string
	}{
		{"missing id column", outbox.Config{Columns: outbox.Columns{AggregateType: "a", AggregateID: "b", Payload: "p"}}, "Columns.ID is empty"},
		{"missing payload column", outbox.Config{Columns: outbox.Columns{ID: "id", AggregateType: "a", AggregateID: "b"}}, "Columns.Payload is empty"},
		{"binary payload in message mode", outbox.Config{Mode: outbox.Message, Columns: outbox.Columns{ID: "id", AggregateType: "a", AggregateID: "b", Payload: "p", BinaryPayload: true}}, "BinaryPayload must be false"},
		{"unknown mode", outbox.Config{Mode: 7}, "unknown Mode 7"},
		{"two fields, one column", outbox.Config{Columns: outbox.Columns{ID: "id", AggregateType: "a", AggregateID: "b", Payload: "p", Headers: "p"}},
			`Columns.Payload and Columns.Headers both name "p"`},
		{"a field named like the owner", outbox.Config{Mode: outbox.Message, Columns: outbox.Columns{ID: "id", AggregateType: "a", AggregateID: "b", Payload: "p", Headers: "__outbox_table"}},
			`Columns.Headers names "__outbox_table", the field a logical message names its outbox table in`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := outbox.New(c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v; want an error containing %q", err, c.want)
			}
		})
	}
}

func TestStatementsRejects(t *testing.T) {
	ok := outbox.Event{AggregateType: "order", AggregateID: "1", Type: "T", Payload: []byte(`{}`)}
	with := func(f func(*outbox.Event)) outbox.Event { e := ok; f(&e); return e }
	keyed := outbox.DefaultColumns()
	keyed.IdempotencyKey = "idempotency_key"
	noType := outbox.Columns{ID: "id", AggregateType: "a", AggregateID: "b", Payload: "p"}
	for _, c := range []struct {
		name  string
		cfg   outbox.Config
		event outbox.Event
		want  string
	}{
		{"empty aggregate type", outbox.Config{}, with(func(e *outbox.Event) { e.AggregateType = "" }), "event 1: AggregateType is empty"},
		{"headers without column", outbox.Config{}, with(func(e *outbox.Event) { e.Headers = map[string]string{"a": "b"} }), "Columns.Headers names no column"},
		// outboxd sets these itself and would stop at the row.
		{"id header", outbox.Config{}, with(func(e *outbox.Event) { e.Headers = map[string]string{"id": "x"} }), `header "id" is one outboxd sets itself`},
		{"event type header", outbox.Config{Mode: outbox.Message}, with(func(e *outbox.Event) { e.Headers = map[string]string{"eventType": "x"} }), `header "eventType" is one outboxd sets itself`},
		{"router's id header", outbox.Config{Columns: func() outbox.Columns { c := outbox.DefaultColumns(); c.Headers, c.IDHeader = "h", "eventId"; return c }()},
			with(func(e *outbox.Event) { e.Headers = map[string]string{"eventId": "x"} }), `header "eventId" is one outboxd sets itself`},
		{"traceparent without column", outbox.Config{}, with(func(e *outbox.Event) { e.Traceparent = "00-x" }), "neither a traceparent nor a headers column"},
		{"partition without column", outbox.Config{}, with(func(e *outbox.Event) { e.Partition = ptr[int32](1) }), "Columns.Partition names no column"},
		{"type without column", outbox.Config{Columns: outbox.Columns{ID: "id", AggregateType: "a", AggregateID: "b", Payload: "p"}}, ok, "Columns.EventType names no column"},
		{"idempotency key without column", outbox.Config{Columns: outbox.DebeziumColumns()}, with(func(e *outbox.Event) { e.IdempotencyKey = "k" }), "apply migration 0002"},
		// DefaultColumns matches migration 0001 alone: the key is opt-in.
		{"idempotency key with default columns", outbox.Config{}, with(func(e *outbox.Event) { e.IdempotencyKey = "k" }),
			`set Columns.IdempotencyKey = "idempotency_key"`},
		// The row is deleted in its own transaction: the unique index
		// would never see the key again.
		{"insert-delete with idempotency key", outbox.Config{Mode: outbox.InsertDelete, Columns: keyed}, with(func(e *outbox.Event) { e.IdempotencyKey = "k" }),
			"the key needs rows kept in the table (Insert mode, rows deleted later)"},
		{"insert-delete with idempotency key, no column", outbox.Config{Mode: outbox.InsertDelete}, with(func(e *outbox.Event) { e.IdempotencyKey = "k" }),
			"InsertDelete mode cannot enforce"},
		{"message with partition", outbox.Config{Mode: outbox.Message}, with(func(e *outbox.Event) { e.Partition = ptr[int32](1) }), "a logical message cannot carry"},
		{"message with idempotency key", outbox.Config{Mode: outbox.Message, Columns: keyed}, with(func(e *outbox.Event) { e.IdempotencyKey = "k" }), "needs a table"},
		{"message with invalid JSON", outbox.Config{Mode: outbox.Message}, with(func(e *outbox.Event) { e.Payload = []byte("{") }), "not valid JSON"},
		{"message headers without field", outbox.Config{Mode: outbox.Message}, with(func(e *outbox.Event) { e.Headers = map[string]string{"a": "b"} }),
			"Columns.Headers names no field"},
		{"message traceparent without field", outbox.Config{Mode: outbox.Message}, with(func(e *outbox.Event) { e.Traceparent = "00-x" }),
			"neither a traceparent nor a headers field"},
		{"message type without field", outbox.Config{Mode: outbox.Message, Columns: noType}, ok, "Columns.EventType names no field"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, err := outbox.New(c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = w.Statements(ok, c.event)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Statements: %v; want an error containing %q", err, c.want)
			}
		})
	}
}

func TestStatementsIDs(t *testing.T) {
	w, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	given := uuid.MustParse("01890a5d-ac96-774b-bcce-b302099a8057")
	evs := []outbox.Event{{AggregateType: "a"}, {AggregateType: "a", ID: given}, {AggregateType: "a"}, {AggregateType: "a"}}
	_, ids, err := w.Statements(evs...)
	if err != nil {
		t.Fatal(err)
	}
	if ids[1] != given {
		t.Errorf("given id replaced: %s", ids[1])
	}
	for _, i := range []int{0, 2, 3} {
		if ids[i].Version() != 7 {
			t.Errorf("id %d is version %d; want UUIDv7", i, ids[i].Version())
		}
	}
	if !(ids[0].String() < ids[2].String() && ids[2].String() < ids[3].String()) {
		t.Errorf("UUIDv7s out of order: %s %s %s", ids[0], ids[2], ids[3])
	}
}

// Large batches are split to stay under Postgres' 65535 bind parameters.
func TestStatementsSplitsLargeBatches(t *testing.T) {
	w, err := outbox.New(outbox.Config{Mode: outbox.InsertDelete})
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]outbox.Event, 14000) // 5 parameters a row: 13107 rows a statement
	for i := range evs {
		evs[i] = outbox.Event{AggregateType: "a", AggregateID: "k"}
	}
	stmts, _, err := w.Statements(evs...)
	if err != nil {
		t.Fatal(err)
	}
	var inserted, deleted int
	for _, s := range stmts {
		if len(s.Args) > 65535 {
			t.Errorf("statement with %d arguments", len(s.Args))
		}
		if strings.HasPrefix(s.SQL, "INSERT") {
			inserted += len(s.Args) / 5
		} else {
			deleted += len(s.Args)
		}
	}
	if len(stmts) != 3 || inserted != len(evs) || deleted != len(evs) {
		t.Errorf("%d statements inserting %d and deleting %d rows; want 3 covering %d", len(stmts), inserted, deleted, len(evs))
	}
}

// DefaultColumns names the columns and headers outboxd's router reads by
// default, so that a Writer and an outboxd left at their defaults agree.
func TestDefaultColumnsAreRouterDefaults(t *testing.T) {
	r := config.Default().Router
	want := outbox.Columns{ID: r.IDColumn, AggregateType: r.RouteByColumn, AggregateID: r.KeyColumn, EventType: r.EventTypeColumn,
		Payload: r.PayloadColumn, Traceparent: r.TraceparentColumn, Headers: r.HeadersColumn,
		IDHeader: r.IDHeader, EventTypeHeader: r.EventTypeHeader}
	if got := outbox.DefaultColumns(); got != want {
		t.Errorf("DefaultColumns = %+v; the router's defaults are %+v", got, want)
	}
}

// DefaultColumns names only columns of migration 0001's table, so that a
// Writer works on the table the README shows.
func TestDefaultColumnsIn0001(t *testing.T) {
	stmts, err := migrations.SQL("public", "outbox")
	if err != nil {
		t.Fatal(err)
	}
	create := stmts[0][strings.Index(stmts[0], "CREATE TABLE"):]
	columns := map[string]bool{}
	for _, l := range strings.Split(create, "\n")[1:] {
		if f := strings.Fields(l); len(f) > 1 {
			columns[f[0]] = true
		}
	}
	c := outbox.DefaultColumns()
	for _, name := range []string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload, c.Traceparent, c.Partition, c.Headers, c.IdempotencyKey} {
		if name != "" && !columns[name] {
			t.Errorf("DefaultColumns names %q, which migration 0001 does not create (it creates %v)", name, columns)
		}
	}
}

// Message mode names every field like the columns (Columns), as outboxd's
// router reads a message; a traceparent goes to its own field, else to the
// headers field.
func TestMessageFields(t *testing.T) {
	id := uuid.MustParse("01890a5d-ac96-774b-bcce-b302099a8057")
	tp := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	full := outbox.Event{ID: id, AggregateType: "order", AggregateID: "42", Type: "OrderPlaced", Payload: []byte(`{"n": 1}`),
		Headers: map[string]string{"tenant": "t1"}, Traceparent: tp}
	debezium := outbox.DebeziumColumns()
	debezium.Traceparent, debezium.Headers = "tracingspancontext", "hdrs"
	headersOnly := outbox.DefaultColumns()
	headersOnly.Headers = "headers"
	custom := outbox.Columns{ID: "event_id", AggregateType: "topic_of", AggregateID: "key", Payload: "body", Headers: "meta"}
	// The owner field names Config.Table only when it is set, even to the
	// default table: a Writer with no Table writes none, as before the
	// field existed, so that its messages stay with the outboxd that
	// delivers unowned ones.
	for _, c := range []struct {
		name  string
		table string // Config.Table
		cols  outbox.Columns
		event outbox.Event
		want  string
	}{
		{"debezium with traceparent field", "", debezium, full,
			`{"id":"` + id.String() + `","aggregatetype":"order","aggregateid":"42","type":"OrderPlaced","payload":{"n":1},"tracingspancontext":"` + tp + `","hdrs":{"tenant":"t1"}}`},
		{"traceparent into headers", "public.outbox", headersOnly, full,
			`{"id":"` + id.String() + `","aggregate_type":"order","aggregate_id":"42","event_type":"OrderPlaced","payload":{"n":1},"headers":{"tenant":"t1","traceparent":"` + tp + `"},"__outbox_table":"public.outbox"}`},
		{"no event type field, nil payload, no headers", "app.events", custom, outbox.Event{ID: id, AggregateType: "order", AggregateID: "42"},
			`{"event_id":"` + id.String() + `","topic_of":"order","key":"42","body":null,"__outbox_table":"app.events"}`},
		{"unqualified table", "events", custom, outbox.Event{ID: id, AggregateType: "order", AggregateID: "42"},
			`{"event_id":"` + id.String() + `","topic_of":"order","key":"42","body":null,"__outbox_table":"public.events"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, err := outbox.New(outbox.Config{Table: c.table, Columns: c.cols, Mode: outbox.Message})
			if err != nil {
				t.Fatal(err)
			}
			stmts, _, err := w.Statements(c.event)
			if err != nil {
				t.Fatal(err)
			}
			if got := stmts[0].Args[0]; got != c.want {
				t.Errorf("content\n%s\nwant\n%s", got, c.want)
			}
		})
	}
	if len(full.Headers) != 1 {
		t.Errorf("the event's headers were changed: %v", full.Headers)
	}
}

// Debezium's column names, a bytea payload and every optional column, with
// both APIs.
func TestWriteOptionalColumns(t *testing.T) {
	d := newDB(t, "outbox_cols")
	ctx := context.Background()
	if _, err := d.pool.Exec(ctx, `CREATE SCHEMA app; CREATE TABLE app.events (
		id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL,
		payload bytea, tracingspancontext text, part int, headers jsonb)`); err != nil {
		t.Fatal(err)
	}
	cols := outbox.DebeziumColumns()
	cols.BinaryPayload = true
	cols.Traceparent, cols.Partition, cols.Headers = "tracingspancontext", "part", "headers"
	w, err := outbox.New(outbox.Config{Table: "app.events", Columns: cols})
	if err != nil {
		t.Fatal(err)
	}
	events := []outbox.Event{
		{AggregateType: "order", AggregateID: "1", Type: "A", Payload: []byte{0, 1, 0xff},
			Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Partition: ptr[int32](2),
			Headers: map[string]string{"tenant": "t1"}},
		{AggregateType: "order", AggregateID: "2", Type: "B"}, // every optional value NULL
	}
	check := func(t *testing.T, ids []uuid.UUID) {
		for i, e := range events {
			var payload []byte
			var trace *string
			var part *int32
			var headers map[string]string
			var typ string
			err := d.pool.QueryRow(ctx, `SELECT type, payload, tracingspancontext, part, headers FROM app.events WHERE id = $1`, ids[i]).
				Scan(&typ, &payload, &trace, &part, &headers)
			if err != nil {
				t.Fatal(err)
			}
			if typ != e.Type || string(payload) != string(e.Payload) || (payload == nil) != (e.Payload == nil) ||
				(trace == nil) != (e.Traceparent == "") || (trace != nil && *trace != e.Traceparent) ||
				(part == nil) != (e.Partition == nil) || (part != nil && *part != *e.Partition) ||
				len(headers) != len(e.Headers) || headers["tenant"] != e.Headers["tenant"] {
				t.Errorf("row %d: type %q payload %v trace %v part %v headers %v; want %+v", i, typ, payload, trace, part, headers, e)
			}
		}
	}
	t.Run("pgx", func(t *testing.T) {
		var ids []uuid.UUID
		err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) (err error) {
			ids, err = w.Write(ctx, tx, events...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		check(t, ids)
	})
	t.Run("sql", func(t *testing.T) {
		db := openSQL(t, d)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := w.WriteSQL(ctx, tx, events...)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		check(t, ids)
	})
	t.Run("traceparent into headers", func(t *testing.T) {
		cols := cols
		cols.Traceparent = ""
		w, err := outbox.New(outbox.Config{Table: "app.events", Columns: cols})
		if err != nil {
			t.Fatal(err)
		}
		var ids []uuid.UUID
		e := events[0]
		err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) (err error) {
			ids, err = w.Write(ctx, tx, e)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		var headers map[string]string
		if err := d.pool.QueryRow(ctx, `SELECT headers FROM app.events WHERE id = $1`, ids[0]).Scan(&headers); err != nil {
			t.Fatal(err)
		}
		if headers["traceparent"] != e.Traceparent || headers["tenant"] != "t1" || len(e.Headers) != 1 {
			t.Errorf("headers %v (event headers now %v)", headers, e.Headers)
		}
	})
}

// A second event with the same idempotency key (migration 0002), or the same
// id, is ErrDuplicate, and the writer leaves the transaction to the caller.
func TestWriteDuplicate(t *testing.T) {
	d := newDB(t, "outbox_dup")
	ctx := context.Background()
	cols := outbox.DefaultColumns()
	cols.IdempotencyKey = "idempotency_key"
	w, err := outbox.New(outbox.Config{Columns: cols})
	if err != nil {
		t.Fatal(err)
	}
	write := func(e outbox.Event) error {
		return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
			_, err := w.Write(ctx, tx, e)
			return err
		})
	}
	first := outbox.Event{AggregateType: "pay", AggregateID: "1", Type: "Paid", IdempotencyKey: "pay-1"}
	if err := write(first); err != nil {
		t.Fatal(err)
	}
	err = write(outbox.Event{AggregateType: "pay", AggregateID: "1", Type: "Paid", IdempotencyKey: "pay-1"})
	if !errors.Is(err, outbox.ErrDuplicate) {
		t.Errorf("same idempotency key: %v; want ErrDuplicate", err)
	}
	id := uuid.Must(uuid.NewV7())
	if err := write(outbox.Event{ID: id, AggregateType: "pay", AggregateID: "2", Type: "Paid"}); err != nil {
		t.Fatal(err)
	}
	if err := write(outbox.Event{ID: id, AggregateType: "pay", AggregateID: "2", Type: "Paid"}); !errors.Is(err, outbox.ErrDuplicate) {
		t.Errorf("same id: %v; want ErrDuplicate", err)
	}
	// The transaction is still the caller's: Write does not end it.
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := w.Write(ctx, tx, first); err == nil {
		t.Fatal("duplicate accepted")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Errorf("rolling back after a failed Write: %v (the writer must not end the transaction)", err)
	}
}

// Message mode writes pg_logical_emit_message records in the documented
// format; a rolled-back transaction's messages are not decoded.
func TestWriteMessages(t *testing.T) {
	d := newDB(t, "outbox_msg")
	ctx := context.Background()
	slot := d.name + "_msg"
	if _, err := d.pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, slot); err != nil {
		t.Fatal(err)
	}
	cols := outbox.DefaultColumns()
	cols.Headers = "headers"
	w, err := outbox.New(outbox.Config{Mode: outbox.Message, MessagePrefix: "outboxd", Columns: cols})
	if err != nil {
		t.Fatal(err)
	}
	events := []outbox.Event{
		{AggregateType: "order", AggregateID: "1", Type: "OrderPlaced", Payload: []byte(`{"id": 1, "items": [1, 2]}`),
			Headers: map[string]string{"tenant": "t1"}, Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{AggregateType: "order", AggregateID: "2", Type: "OrderPlaced"},
	}
	ids := writeCommitted(t, d.pool, w, events...)
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "3", Type: "RolledBack"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	rows, err := d.pool.Query(ctx, `SELECT data FROM pg_logical_slot_get_changes($1, NULL, NULL)`, slot)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	type message struct {
		Owner         string            `json:"__outbox_table"`
		ID            string            `json:"id"`
		AggregateType string            `json:"aggregate_type"`
		AggregateID   string            `json:"aggregate_id"`
		EventType     string            `json:"event_type"`
		Payload       json.RawMessage   `json:"payload"`
		Headers       map[string]string `json:"headers"`
	}
	var got []message
	for _, l := range lines {
		// test_decoding: "message: transactional: 1 prefix: outboxd, sz: 42 content:{...}"
		if !strings.HasPrefix(l, "message:") {
			continue
		}
		if !strings.Contains(l, "transactional: 1 prefix: outboxd,") {
			t.Errorf("message not transactional or wrong prefix: %s", l)
		}
		_, content, _ := strings.Cut(l, " content:")
		var m message
		if err := json.Unmarshal([]byte(content), &m); err != nil {
			t.Fatalf("message content %q: %v", content, err)
		}
		got = append(got, m)
	}
	if len(got) != 2 {
		t.Fatalf("decoded %d messages, want 2 (the rolled-back one must not appear):\n%s", len(got), strings.Join(lines, "\n"))
	}
	// No Config.Table: the messages name no owner (__outbox_table absent).
	want0 := message{ID: ids[0].String(), AggregateType: "order", AggregateID: "1", EventType: "OrderPlaced",
		Payload: json.RawMessage(`{"id":1,"items":[1,2]}`), Headers: map[string]string{"tenant": "t1", "traceparent": events[0].Traceparent}}
	if g := got[0]; g.Owner != want0.Owner || g.ID != want0.ID || g.AggregateType != want0.AggregateType || g.AggregateID != want0.AggregateID ||
		g.EventType != want0.EventType || string(g.Payload) != string(want0.Payload) || len(g.Headers) != 2 ||
		g.Headers["tenant"] != "t1" || g.Headers["traceparent"] != events[0].Traceparent {
		t.Errorf("message 0 = %+v; want %+v", g, want0)
	}
	if g := got[1]; g.ID != ids[1].String() || string(g.Payload) != "null" || g.Headers != nil {
		t.Errorf("message 1 = %+v; want id %s, payload null, no headers", g, ids[1])
	}
}
