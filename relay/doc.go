// Package relay is outboxd's supervisor: it runs, restarts and shards
// pipelines. In each run the replication stream (package wal) feeds the
// pipeline (package internal/delivery), which routes and hands records to
// the Kafka producer (package sink), and the checkpoint tracker decides
// what the stream confirms to Postgres.
//
// Goroutines and ownership, for one pipeline run:
//
//   - the stream goroutine owns the replication connection: it receives,
//     decodes, sends standby status and hands wal.Items to a bounded
//     channel;
//   - the pipeline goroutine (a delivery.Pipeline) consumes that channel in
//     order, routes inserts and hands records to the producer, registering
//     each with the tracker first;
//   - franz-go's goroutines call each record's done function, which acks the
//     tracker or, on failure, cancels the run with the error;
//   - the stall watchdog (sink.Producer.Watch) ends a run whose records see
//     no acknowledgement for kafka.delivery_timeout.
//
// A run goes through four stages, connect, start, stream and drain
// (run.go; DESIGN.md gives each stage's shutdown rules).
//
// Run supervises runs: a failed run is torn down (the producer is closed, the
// last safe position is reported) and a new one starts from the slot's
// confirmed position after a backoff. Errors that a restart cannot fix (a
// row that cannot be routed, an invalidated or dropped slot, a dropped
// publication, a decoding failure; IsPermanent tells them, each error
// answering for itself with a Permanent method) end Run with the error.
//
// Check runs the start-up checks (package internal/preflight) and returns
// what they found and opened as a *Checked: the slot's history, the table
// schema the router is built from, and for the first pipeline the Postgres
// connection, the replication connection and the warmed Kafka client. Run
// takes that value, and the first pipeline streams on it instead of
// connecting again. Run(ctx, nil) opens its own. A *Checked that will not be
// given to Run is closed with its Close. Check and Run must not run at the
// same time. Each run returns what it achieved to Run's loop; no field of
// Relay is written by one run for the next.
//
// Shards (shards.go) runs a whole outboxd (Start, then Run of the Started
// value it returns): with postgres.shards: N > 1 one
// Relay per shard (each on its own slot and publication, with its own
// connections, producer, tracker and metrics labelled with its slot) under
// one errgroup, after the reshard loop of package internal/reshard has
// brought the database to N shards; an old shard drains with its reshard
// window (Relay.window, set by Shards before Run). With one shard it is one
// Relay, as before.
//
// Shutdown (ctx done): the stream stops at the next transaction boundary,
// in-flight records get until shutdown_timeout to be acknowledged, and the
// final status reports the last fully delivered transaction.
package relay
