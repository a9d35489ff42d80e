package outbox_test

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
)

// A Writer runs one multi-row INSERT for any number of events, and in
// InsertDelete mode one DELETE in the same round trip. Statements shows what
// Write would run.
func ExampleWriter_Statements() {
	w, err := outbox.New(outbox.Config{Mode: outbox.InsertDelete})
	if err != nil {
		panic(err)
	}
	stmts, ids, err := w.Statements(
		outbox.Event{
			ID:            uuid.MustParse("01890a5d-ac96-774b-bcce-b302099a8057"),
			AggregateType: "order", AggregateID: "42", Type: "OrderPlaced",
			Payload: []byte(`{"id": 42, "total": "9.90"}`),
		},
		outbox.Event{
			ID:            uuid.MustParse("01890a5d-ac96-774b-bcce-b302099a8058"),
			AggregateType: "order", AggregateID: "42", Type: "OrderPaid",
			Payload: []byte(`{"id": 42}`),
		},
	)
	if err != nil {
		panic(err)
	}
	for _, s := range stmts {
		fmt.Println(s.SQL)
		fmt.Println(s.Args...)
	}
	fmt.Println(len(ids), "ids")
	// Output:
	// INSERT INTO "public"."outbox" ("id", "aggregate_type", "aggregate_id", "event_type", "payload") VALUES ($1, $2, $3, $4, $5), ($6, $7, $8, $9, $10)
	// 01890a5d-ac96-774b-bcce-b302099a8057 order 42 OrderPlaced {"id": 42, "total": "9.90"} 01890a5d-ac96-774b-bcce-b302099a8058 order 42 OrderPaid {"id": 42}
	// DELETE FROM "public"."outbox" WHERE "id" IN ($1, $2)
	// 01890a5d-ac96-774b-bcce-b302099a8057 01890a5d-ac96-774b-bcce-b302099a8058
	// 2 ids
}

// An idempotency key needs migration 0002 and Insert mode: the unique index
// rejects a second event with the key only while the first one's row is in
// the table, so delete the rows later, not in the same transaction.
func ExampleWriter_Statements_idempotencyKey() {
	cols := outbox.DefaultColumns()
	cols.IdempotencyKey = "idempotency_key" // migrations/0002_idempotency_key.sql
	w, err := outbox.New(outbox.Config{Columns: cols, Mode: outbox.Insert})
	if err != nil {
		panic(err)
	}
	stmts, _, err := w.Statements(outbox.Event{
		ID:            uuid.MustParse("01890a5d-ac96-774b-bcce-b302099a8058"),
		AggregateType: "order", AggregateID: "42", Type: "OrderPaid",
		Payload: []byte(`{"id": 42}`), IdempotencyKey: "pay-42",
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(stmts[0].SQL)
	fmt.Println(stmts[0].Args...)
	// Output:
	// INSERT INTO "public"."outbox" ("id", "aggregate_type", "aggregate_id", "event_type", "payload", "idempotency_key") VALUES ($1, $2, $3, $4, $5, $6)
	// 01890a5d-ac96-774b-bcce-b302099a8058 order 42 OrderPaid {"id": 42} pay-42
}

// A logical message instead of a row. Its fields are named like the columns,
// here Debezium's, plus a headers field: outboxd routes it with
// router.preset: debezium and router.headers_column: headers (and, as
// Config.MessagePrefix is left at "outbox", router.messages.prefix: outbox).
func ExampleWriter_Statements_message() {
	cols := outbox.DebeziumColumns()
	cols.Headers = "headers"
	w, err := outbox.New(outbox.Config{Columns: cols, Mode: outbox.Message})
	if err != nil {
		panic(err)
	}
	stmts, _, err := w.Statements(outbox.Event{
		ID:            uuid.MustParse("01890a5d-ac96-774b-bcce-b302099a8057"),
		AggregateType: "order", AggregateID: "42", Type: "OrderPlaced",
		Payload:     []byte(`{"id": 42}`),
		Headers:     map[string]string{"tenant": "t1"},
		Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(stmts[0].SQL)
	fmt.Println(stmts[0].Args...)
	// Output:
	// SELECT pg_logical_emit_message(true, 'outbox', content) FROM (VALUES ($1::text)) AS m(content)
	// {"id":"01890a5d-ac96-774b-bcce-b302099a8057","aggregatetype":"order","aggregateid":"42","type":"OrderPlaced","payload":{"id":42},"headers":{"tenant":"t1","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
}

// Write in the transaction that makes the business change. The event exists
// if and only if the transaction commits.
func ExampleWriter_Write() {
	placeOrder := func(ctx context.Context, conn *pgx.Conn, w *outbox.Writer) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total) VALUES (42, 9.90)`); err != nil {
				return err
			}
			_, err := w.Write(ctx, tx, outbox.Event{
				AggregateType: "order", AggregateID: "42", Type: "OrderPlaced",
				Payload: []byte(`{"id": 42, "total": "9.90"}`),
			})
			return err // pgx.BeginFunc commits on nil, rolls back otherwise
		})
	}
	_ = placeOrder
}
