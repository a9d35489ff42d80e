// Package eos decides, without I/O, what exactly-once delivery
// (kafka.delivery: exactly_once) does with a replication stream: which
// Postgres transactions and rows a restart skips because an earlier run
// put them in Kafka, when a Kafka transaction opens and commits, when a
// Postgres transaction is split over Kafka transactions (by size and by
// age), the position each commit writes to kafka.positions_topic (with the
// split marker), how a position written on an earlier timeline applies
// after a promotion, and which positions are refused (another slot's,
// another database's, an old primary's, one past the server's WAL).
//
// It owns no connection, logger or clock: the caller passes the time with
// the inputs that need it and carries out the actions it gets back. Its
// rules are stated in DESIGN.md, "Exactly-once mode".
//
// The caller's duties, for one run, in order:
//
//  1. Read the server's system identifier, timeline and WAL end
//     (IDENTIFY_SYSTEM) and the timeline's history (TIMELINE_HISTORY) on
//     the run's replication connection before it streams. Once the run
//     holds the slot, initialise the transactional producer, which fences
//     the id's previous holder, and Read the id's last committed position:
//     one that names another slot or database is a *RefusedError (stop, do
//     not retry). Apply it to the server with Resume.
//  2. Confirm the resumed position to the slot when nothing is registered
//     yet, and create the Machine with New, giving it the confirmed
//     position.
//  3. Feed the Machine the stream in order: Begin for each transaction's
//     Begin (with the tracker's unconfirmed transactions), Row for each row
//     before it is produced, Commit for each Commit, Boundary at every
//     Postgres transaction boundary the caller sees (before a Begin, after
//     a Commit, after a batch), Tick when Due passes with nothing arriving,
//     and Finish when the stream ends cleanly.
//  4. Carry out each Step in its order: leave the item out (Skip); commit
//     the open Kafka transaction writing Position (Commit); release the
//     holds of the Release oldest completed Postgres transactions; open a
//     Kafka transaction (Open). A transaction's hold is taken at its Begin
//     and belongs to the completed ones from its Commit on.
//  5. When an action fails, end the run: the Machine assumes every action
//     it returned was carried out, and is not used again. The caller aborts
//     the Kafka transaction it leaves open.
package eos
