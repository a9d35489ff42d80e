// Package slotlag exports what pg_replication_slots says about outboxd's
// slot as the outboxd_slot_* metrics: delivery lag and retained WAL in
// bytes, the holder, wal_status and safe_wal_size.
//
// Monitor.Run reads the slot's row on a regular connection of its own,
// apart from the pipeline: it works while the pipeline restarts or waits as
// a standby, and its failures never stop the pipeline (they stop
// outboxd_slot_last_read_timestamp_seconds, count in
// outboxd_slot_read_errors_total and are logged at most once a minute).
//
// The caller's duty: run Run on a goroutine it waits for, and end it by
// ending its ctx.
package slotlag
