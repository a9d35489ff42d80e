// Package backfill delivers the rows already in the outbox table when
// outboxd creates its slot (postgres.backfill), before the slot's first
// event: the rows a polling relay left pending. DESIGN.md ("Backfill")
// states why the row set is exact.
//
// The caller's duties:
//
//  1. Call Prepare where the slot would be created, before the slot is
//     inspected: it creates the slot with its snapshot exported, fixes the
//     backfill's rows (their keys, in a table of outboxd's own) inside that
//     snapshot, and records the run in the state table; on a slot that
//     exists it checks that a backfill made it, and on a run a kill
//     interrupted before it recorded its rows fixed it drops the slot and
//     starts again (the cut-over moving to the new slot's point).
//  2. Before each START_REPLICATION on the slot, call Open, and when it
//     returns a Backfill (the backfill is not done), its Run, then Close;
//     start replication only when Open returned nil or Run returned nil.
//     Run sends the rows not yet acknowledged, page by page, pages in
//     flight up to kafka.max_buffered_records rows, each page acknowledged
//     by Kafka, with every page before it, before its last key is recorded
//     (window.go), and marks the backfill done. An error is retried as the pipeline's are: a kill or
//     a failure repeats at most the pages in flight.
//     In exactly-once mode call RunExactlyOnce instead, after Open, with
//     the slot's transactional producer initialised after Open returned
//     (never before: only the lock's holder fences) and the position its
//     id last committed, read after the initialisation (Committed): it
//     goes on after the cursor Kafka committed, and a kill or failure
//     repeats nothing a read_committed consumer sees.
//  3. Never confirm a position of the slot before Run (RunExactlyOnce)
//     returned nil.
//  4. Without postgres.backfill, call RefuseUnfinished at start-up after
//     the slot was inspected, not before: a backfill of the slot that is
//     not done, another process's at work or a stopped one, is refused.
//     It reads the state table of every schema, and refuses one its role
//     may not read.
package backfill
