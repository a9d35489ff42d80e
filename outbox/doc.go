// Package outbox writes transactional-outbox events inside the caller's
// database transaction, for outboxd (or Debezium's EventRouter) to stream to
// Kafka.
//
// A Writer describes the outbox once: the table, its column names (Columns;
// DefaultColumns matches outboxd's defaults, DebeziumColumns matches
// Debezium's) and the Mode. Write takes a pgx.Tx, WriteSQL a *sql.Tx; both
// write any number of events in one round trip (one multi-row statement, or
// one pgx batch when Mode is InsertDelete) and return the event ids.
//
// The caller's duties:
//
//  1. Begin the transaction, make the business change and call Write (or
//     WriteSQL) in it. The event is delivered if and only if that
//     transaction commits.
//  2. Commit or roll back. Write never does either; when it returns an error
//     the transaction is usually aborted (Postgres refuses further
//     statements), so roll it back.
//  3. Apply the outbox migrations (`outboxd migrate`) before writing, and
//     0002_idempotency_key.sql if events carry an IdempotencyKey.
//  4. Keep Columns and Mode in step with outboxd's router settings.
//
// # Event ids
//
// An Event with a zero ID gets a UUIDv7: time-ordered, so inserts land at the
// right edge of the primary key index. Consumers deduplicate on this id
// (outboxd sends it as the Kafka header "id"); set it yourself to make a
// retried write carry the same id.
//
// # Modes
//
// Insert (the default) leaves the rows in the table; delete them later.
// InsertDelete inserts and deletes the rows in the same transaction: the WAL
// carries the INSERT, which outboxd delivers, and the DELETE, which it
// ignores, so the table stays empty. Message writes no row at all but one
// logical decoding message per event:
//
//	SELECT pg_logical_emit_message(true, prefix, content)
//
// transactional, so it is decoded only if the transaction commits. content is
// a JSON object:
//
//	{"id": "0190…", "aggregate_type": "order", "aggregate_id": "42",
//	 "event_type": "OrderPlaced", "payload": {…}, "headers": {"k": "v"}}
//
// payload is the event's payload embedded as JSON (null when empty); it must
// be valid JSON. headers is present only when the event has headers or a
// traceparent (which is sent as header "traceparent"). Partition and
// IdempotencyKey cannot be expressed in a message and are errors in this
// mode.
//
// # Optional columns
//
// Traceparent, Partition, Headers (jsonb object of string values) and
// IdempotencyKey are written only to columns named in Columns. An event that
// sets one of them when the table has no such column is an error rather
// than data dropped on the floor; the one exception is a traceparent, which
// goes into the headers column when there is no traceparent column.
//
// # Payload
//
// Payload is sent as text, which suits jsonb, json and text columns; set
// Columns.BinaryPayload for a bytea column to send the raw bytes.
package outbox
