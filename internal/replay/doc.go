// Package replay sends rows still in the outbox table to Kafka once more
// (outboxd replay), beside a running outboxd: the rows that match an
// operator's WHERE clause, routed by the router the daemon routes them with
// (built from the configuration and the table's schema), produced by the
// daemon's producer (package sink: idempotent, acks=all, murmur2), each
// record carrying the usual headers and Header with the run's id.
//
// A run reads the table in keyset pages ordered by the order column and the
// primary key, each page in a READ ONLY transaction of its own, and sends
// one page at a time through one producer: each key's records keep the
// table's order. It records its progress, the key of the last row Kafka
// acknowledged with every row before it, in a state table of its own
// (State; outboxd never writes the outbox table), after each page. A run
// killed at any point resumes from there and sends again at most the page
// that was in flight. The rows of a run are those that match when it
// starts, up to the last one's key; rows deleted before a page reads them
// are not sent, and cannot be: the table no longer has them.
//
// The caller's duties:
//
//  1. Open a run with Options (CheckWhere checks the clause's shape first;
//     Open checks it on the server, in a READ ONLY transaction).
//  2. Call Run once, with a context that ends on SIGINT or SIGTERM: Run then
//     waits up to shutdown_timeout for the records in flight and records
//     them, so that a resumed run repeats nothing.
//  3. Close the Replay, which releases the run's lock (a session advisory
//     lock: two processes never run one run at once).
//  4. Show the operator the run's id (ID) before Run: it is what resumes a
//     stopped run.
package replay
