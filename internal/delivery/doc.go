// Package delivery is one run's pipeline and what it needs that is no
// supervision: Pipeline routes the stream's items (wal.Item) in order and
// hands the records to the producer under the ack rule (Produce: each
// registered with its transaction before it is handed over), applies the
// poison policy (DeadLetter), router.on_update and the message rules
// (MessageKey), and an old or new shard's reshard window; in exactly-once
// mode RunExactlyOnce fences the transactional id, reads the position
// committed in Kafka and drives an eos.Machine (ExactlyOnce), committing at
// the transaction boundaries (LastCommit) and on its timer. ReadServer and
// TransactionalID serve the connect stage, and Delivered a reshard's
// reading of the old shards' positions.
//
// The caller (relay) owns the run:
//
//  1. It builds a Pipeline per run (NewPipeline) with the run's tracker,
//     producer and fail function, and lets only the pipeline goroutine use
//     it; it Closes it after.
//  2. It feeds Run (or RunExactlyOnce) the stream's batches in order and
//     closes the channel at a transaction boundary to stop.
//  3. It stops the run when Run returns an error or a record's failure
//     calls Setup.Fail, and confirms to Postgres only what the tracker
//     confirms (checkpoint.Tracker.Confirmed).
//
// The pipeline takes its producer as the small Producer interface, so its
// routing, delivery and dead-letter paths are tested without Kafka, and
// under broker faults with kfake.
package delivery
