package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testenv/daemon"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/outbox"
)

// Events written through Write (pgx) and WriteSQL (database/sql), one and
// many at a time, in both table modes, arrive through outboxd with the right
// topic, key, headers and value; events of rolled-back transactions never do.
func TestWriteDeliveredByOutboxd(t *testing.T) {
	d := newDB(t, "outbox_write")
	startRelay(t, d)
	sqlDB := openSQL(t, d)
	ctx := context.Background()

	aggregate := "ow_" + testenv.RandomSuffix()
	topic := aggregate + "-events"
	type want struct{ key, typ, value string }
	expected := map[string]want{}
	events := func(key string, n int) []outbox.Event {
		var evs []outbox.Event
		for i := range n {
			evs = append(evs, outbox.Event{
				AggregateType: aggregate, AggregateID: key, Type: fmt.Sprintf("%sHappened%d", key, i),
				Payload: fmt.Appendf(nil, `{"n": %d}`, i),
			})
		}
		return evs
	}
	remember := func(evs []outbox.Event, ids []uuid.UUID) {
		for i, e := range evs {
			expected[ids[i].String()] = want{key: e.AggregateID, typ: e.Type, value: string(e.Payload)}
		}
	}
	writePgx := func(w *outbox.Writer, evs []outbox.Event, commit bool) []uuid.UUID {
		t.Helper()
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		ids, err := w.Write(ctx, tx, evs...)
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return ids
	}
	writeSQL := func(w *outbox.Writer, evs []outbox.Event, commit bool) []uuid.UUID {
		t.Helper()
		tx, err := sqlDB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		ids, err := w.WriteSQL(ctx, tx, evs...)
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		return ids
	}
	writers := map[outbox.Mode]*outbox.Writer{}
	for _, m := range []outbox.Mode{outbox.Insert, outbox.InsertDelete} {
		w, err := outbox.New(outbox.Config{Mode: m})
		if err != nil {
			t.Fatal(err)
		}
		writers[m] = w
	}

	var kept []uuid.UUID // ids whose rows stay in the table (Insert mode)
	cases := []struct {
		key  string
		n    int
		mode outbox.Mode
		sql  bool
	}{
		{"pgx-one", 1, outbox.Insert, false},
		{"pgx-many", 7, outbox.InsertDelete, false},
		{"sql-one", 1, outbox.InsertDelete, true},
		{"sql-many", 7, outbox.Insert, true},
	}
	for _, c := range cases {
		evs := events(c.key, c.n)
		var ids []uuid.UUID
		if c.sql {
			ids = writeSQL(writers[c.mode], evs, true)
		} else {
			ids = writePgx(writers[c.mode], evs, true)
		}
		if len(ids) != c.n {
			t.Fatalf("%s: %d ids for %d events", c.key, len(ids), c.n)
		}
		remember(evs, ids)
		if c.mode == outbox.Insert {
			kept = append(kept, ids...)
		}
	}
	// Rolled back: never delivered. The committed event after them has the
	// same key, so the same partition: once it is read, they would have been.
	rolledBack := map[string]bool{}
	for _, id := range writePgx(writers[outbox.Insert], events("last", 3), false) {
		rolledBack[id.String()] = true
	}
	for _, id := range writeSQL(writers[outbox.InsertDelete], events("last", 3), false) {
		rolledBack[id.String()] = true
	}
	last := events("last", 1)
	remember(last, writePgx(writers[outbox.InsertDelete], last, true))

	recs := readTopic(t, d.brokers, topic, len(expected), 500*time.Millisecond)
	seen := map[string]bool{}
	for _, r := range recs {
		id, _ := header(r, "id")
		if rolledBack[id] {
			t.Errorf("event %s of a rolled-back transaction was delivered", id)
			continue
		}
		w, ok := expected[id]
		if !ok {
			t.Errorf("unexpected record id=%q key=%q value=%q", id, r.Key, r.Value)
			continue
		}
		if seen[id] {
			t.Errorf("event %s delivered twice", id)
		}
		seen[id] = true
		typ, _ := header(r, "eventType")
		if string(r.Key) != w.key || typ != w.typ || string(r.Value) != w.value || r.Topic != topic {
			t.Errorf("event %s: got topic %q key %q eventType %q value %q; want %q %q %q %q",
				id, r.Topic, r.Key, typ, r.Value, topic, w.key, w.typ, w.value)
		}
	}
	if len(seen) != len(expected) {
		t.Errorf("%d of %d events delivered", len(seen), len(expected))
	}

	// Insert mode keeps its rows; InsertDelete leaves none.
	var rows int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != len(kept) {
		t.Errorf("outbox holds %d rows; want the %d written in Insert mode", rows, len(kept))
	}
}

// A Writer with the default columns writes to a table made by migration 0001
// alone (the table the README shows), in both table modes.
func TestWriteTableFrom0001(t *testing.T) {
	d := newDB(t, "outbox_0001")
	ctx := context.Background()
	stmts, err := migrations.SQL("plain", "outbox")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.pool.Exec(ctx, "CREATE SCHEMA plain; "+stmts[0]); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []outbox.Mode{outbox.Insert, outbox.InsertDelete} {
		t.Run(mode.String(), func(t *testing.T) {
			w, err := outbox.New(outbox.Config{Table: "plain.outbox", Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
				_, err := w.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "1", Type: "OrderPlaced", Payload: []byte(`{}`)})
				return err
			})
			if err != nil {
				t.Fatalf("writing to a table made by migration 0001: %v", err)
			}
		})
	}
}

// Message mode with the columns of outboxd's router settings, none of them
// outboxd's defaults, and both prefixes left at their defaults: outboxd
// delivers the events with the right topic, key, value and headers. The
// writer's Config.Table is first left empty (its messages name no owner, and
// this outboxd, of app.events, takes unowned ones: the writer of before the
// owner field, upgraded), then set to outboxd's postgres.table.
func TestMessagesDeliveredByOutboxd(t *testing.T) {
	d := newDB(t, "outbox_msgs")
	ctx := context.Background()
	if _, err := d.pool.Exec(ctx, `CREATE SCHEMA app; CREATE TABLE app.events (
		event_id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL,
		body jsonb, span text, meta jsonb)`); err != nil {
		t.Fatal(err)
	}
	cfg := daemon.Config(d.dsn, d.name, d.brokers)
	cfg.Postgres.Table = "app.events"
	r := &cfg.Router
	r.IDColumn, r.RouteByColumn, r.KeyColumn, r.EventTypeColumn = "event_id", "aggregatetype", "aggregateid", "type"
	r.PayloadColumn, r.TraceparentColumn, r.HeadersColumn = "body", "span", "meta"
	daemon.Start(t, cfg)

	// The writer names the same fields as the router settings above, with
	// outboxd's default id and event type headers.
	cols := outbox.Columns{ID: "event_id", AggregateType: "aggregatetype", AggregateID: "aggregateid", EventType: "type",
		Payload: "body", Traceparent: "span", Headers: "meta", IDHeader: "id", EventTypeHeader: "eventType"}
	for _, table := range []string{"", "app.events"} {
		t.Run("table "+strconv.Quote(table), func(t *testing.T) {
			w, err := outbox.New(outbox.Config{Table: table, Columns: cols, Mode: outbox.Message})
			if err != nil {
				t.Fatal(err)
			}
			checkDelivered(t, d, w)
		})
	}
}

// checkDelivered writes two events with w and checks that outboxd delivers
// them with the right topic, key, value and headers.
func checkDelivered(t *testing.T, d *testDB, w *outbox.Writer) {
	t.Helper()
	aggregate := "om_" + testenv.RandomSuffix()
	tp := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	events := []outbox.Event{
		{AggregateType: aggregate, AggregateID: "1", Type: "OrderPlaced", Payload: []byte(`{"n":1}`),
			Headers: map[string]string{"tenant": "t1"}, Traceparent: tp},
		{AggregateType: aggregate, AggregateID: "1", Type: "OrderPaid", Payload: []byte(`{"n":2}`)},
	}
	ids := writeCommitted(t, d.pool, w, events...)
	recs := readTopic(t, d.brokers, aggregate+"-events", len(events), 500*time.Millisecond)
	if len(recs) != len(events) {
		t.Fatalf("%d records; want %d", len(recs), len(events))
	}
	for i, rec := range recs {
		e := events[i]
		want := map[string]string{"id": ids[i].String(), "eventType": e.Type}
		if e.Traceparent != "" {
			want["traceparent"] = e.Traceparent
		}
		for k, v := range e.Headers {
			want[k] = v
		}
		got := map[string]string{}
		for _, h := range rec.Headers {
			got[h.Key] = string(h.Value)
		}
		if string(rec.Key) != e.AggregateID || string(rec.Value) != string(e.Payload) || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("record %d: key %q value %q headers %v; want %q %q %v", i, rec.Key, rec.Value, got, e.AggregateID, e.Payload, want)
		}
	}
}
