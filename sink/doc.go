// Package sink produces routed outbox records to Kafka with franz-go.
//
// Producer settings are fixed where correctness depends on them: the
// idempotent producer (franz-go's default, never disabled here), acks=all,
// and Java-compatible murmur2 partitioning for keyed records (the same key
// lands on the same partition as with Java clients and Debezium). A record
// that fails fails every later buffered record of its partition (franz-go is
// gapless), so per-key order holds across a failure.
//
// The caller's duties:
//
//  1. Call Warm (or Ping) before the first Produce, to fail fast on
//     unreachable brokers; Warm also loads the producer id.
//  2. Call Produce for each record in commit order. It blocks while
//     max_buffered_records, or records of max_buffered_bytes, are
//     unacknowledged: that is the backpressure that stops WAL reading.
//  3. Treat a non-nil error passed to a record's done function as the end of
//     this Producer: stop, do not confirm past the record, Close, and start a
//     new Producer from the slot's confirmed position.
package sink
