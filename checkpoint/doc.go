// Package checkpoint decides which WAL position outboxd may confirm to Postgres.
//
// This is the ack rule, the heart of outboxd's delivery guarantee: a
// transaction's commit end LSN is confirmed only when every record of that
// transaction and of every earlier transaction has been acknowledged by Kafka.
// Acknowledgements may arrive in any order; the confirmed position is the end
// LSN of the highest transaction in the contiguous fully-acknowledged prefix,
// never the highest position seen.
//
// The caller's duties, in order:
//
//  1. Create one Tracker per replication session with New, starting at the
//     slot's confirmed_flush_lsn.
//  2. For each transaction, in commit order: call WaitRoom with the cap on
//     unconfirmed transactions (backpressure), then Begin, then Add once per
//     record handed to the producer (before handing it over), then Commit with
//     the transaction's end LSN once the last row has been added.
//  3. From any goroutine, call Ack on the transaction once per delivered
//     record. Never call Ack for a record that failed: a failure stops the
//     pipeline instead, and the position stays where it was.
//  4. Call Idle with the server's WAL end from a keepalive, in stream order
//     (after every message received before it was handled). It advances the
//     position only when no transaction is open or unacknowledged, which keeps
//     an idle outbox from pinning WAL.
//  5. Read Confirmed whenever a standby status update is due.
//
// A Tracker never logs and owns no connection. It reads the wall clock only
// to stamp when the oldest unconfirmed transaction began waiting and when a
// transaction's last record was handed over, which Waiting reports to the
// stall watchdog; the ack rule itself depends on no time. It is safe for
// concurrent use.
package checkpoint
