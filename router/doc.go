// Package router turns an outbox row into a Kafka record the way Debezium's
// Outbox EventRouter does: the topic comes from a template filled with the
// route-by column (by default "${routedByValue}-events" with aggregate_type),
// the key is the key column's bytes (aggregate_id), the value is the payload
// column byte for byte (Postgres' text form; bytea as raw bytes), and headers
// carry the event id and the event type.
//
// A Router is pure: it owns no connection, logger or clock. It caches the
// column layout of the last relation it saw and recomputes it when pgoutput
// describes the table anew (after ALTER TABLE). It is not safe for
// concurrent use.
//
// A row that cannot be routed yields a *RowError. It is never skipped: the
// caller stops (or, once configured, dead-letters it).
package router
