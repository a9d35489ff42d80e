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
//  3. Apply the outbox migrations (`outboxd migrate`) before writing. To use
//     IdempotencyKey, also have migration 0002_idempotency_key.sql applied
//     (`outboxd migrate` applies it, except to a partitioned table), set
//     Columns.IdempotencyKey = "idempotency_key", and use Insert mode.
//  4. Keep Columns and Mode in step with outboxd's router settings. Each
//     name equals the setting outboxd reads it by: ID id_column,
//     AggregateType route_by_column, AggregateID key_column, EventType
//     event_type_column ("" for "-"), Payload payload_column, Traceparent
//     traceparent_column, Headers headers_column, Partition the column of
//     additional_fields placed as partition, IDHeader id_header and
//     EventTypeHeader event_type_header. In Message mode, keep
//     Config.MessagePrefix equal to router.messages.prefix; set Config.Table
//     only to the exact postgres.table of the outboxd that is to deliver the
//     events, or leave it empty (see Owner below).
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
// transactional, so it is decoded only if the transaction commits. prefix is
// Config.MessagePrefix; outboxd routes only the messages whose prefix is its
// router.messages.prefix and ignores the others, so the two must be equal.
// Both default to "outbox" (DefaultMessagePrefix).
//
// content is a JSON object whose fields are named like the columns
// (Columns), which is how outboxd's router reads a message. With
// DefaultColumns and Columns.Headers = "headers" (router.headers_column:
// headers):
//
//	{"id": "0190…", "aggregate_type": "order", "aggregate_id": "42",
//	 "event_type": "OrderPlaced", "payload": {…}, "headers": {"k": "v"}}
//
// The fields are: Columns.ID, the event id; Columns.AggregateType and
// Columns.AggregateID; Columns.EventType, when it names one; Columns.Payload,
// the event's payload embedded as JSON (null when nil), which must be valid
// JSON; Columns.Traceparent, when it names one and the event has a
// traceparent; and Columns.Headers, an object of string values, when the
// event has headers, or a traceparent and there is no traceparent field (it
// is then the header "traceparent"). As in the table modes, an event with a
// Type, Headers or a Traceparent that no field is named for is an error.
// Partition and IdempotencyKey cannot be expressed in a message and are
// errors in this mode. Last comes OwnerField, "__outbox_table", with
// Config.Table, schema-qualified, when Config.Table is set:
//
//	{…, "__outbox_table": "app.outbox"}
//
// # Owner
//
// Every replication slot on a database receives every logical message, so
// without an owner every outboxd on the database would deliver each one.
// OwnerField names the outbox the message belongs to, and each outboxd
// decides from the message alone (so that a replay decides the same):
//
//   - a message that names the outboxd's postgres.table (compared exactly,
//     schema-qualified, "public." added to a name without a schema) is
//     delivered by it;
//   - a message that names another table is left by it (counted in
//     outboxd_wal_changes_total{op="message_other_outbox"}, the first one
//     logged): if no outboxd has that postgres.table, no one delivers it;
//   - a message that names none goes to the outboxd with
//     router.messages.unowned: deliver, the default.
//
// A Writer writes OwnerField only when Config.Table is set, even to
// "public.outbox"; with Config.Table empty its messages name none, as those
// of a version of this package that predates the field did, and go where
// they went before. Set Config.Table in Message mode only when several
// outboxd share the database, and then to exactly the postgres.table of the
// outboxd that is to deliver the events: a Table that no outboxd has loses
// the events to every one of them (each counts and logs them). An outboxd
// that predates the field ignores it and delivers the message, as it did.
//
// # Optional columns
//
// Traceparent, Partition, Headers (a json or jsonb object of string values)
// and IdempotencyKey are written only to columns named in Columns. An event
// that sets one of them when the table has no such column is an error rather
// than data dropped on the floor; the one exception is a traceparent, which
// goes into the headers column when there is no traceparent column.
//
// # Idempotency keys
//
// Migration 0002 adds the column idempotency_key with a unique index, which
// rejects an event whose key is already in the table (Write returns
// ErrDuplicate). That holds only while the first event's row is in the
// table, so keys need Insert mode, with rows deleted later, no sooner than a
// duplicate may still arrive. InsertDelete mode refuses an event with a key:
// its row is deleted in the same transaction, so neither a later insert nor
// a concurrent one (once the first commits) would ever conflict with it.
// DefaultColumns leaves the key out, so that a table made by migration 0001
// alone works; set Columns.IdempotencyKey to use it. A partitioned outbox
// table cannot have the index (Postgres needs the partition key in a unique
// index), so `outboxd migrate` leaves migration 0002 out for one.
//
// # Payload
//
// Payload is sent as text, which suits jsonb, json and text columns; set
// Columns.BinaryPayload for a bytea column to send the raw bytes.
package outbox
