// Package shard splits the outbox tables' stream over several replication
// slots, so that several walsenders decode it in parallel, and changes the
// number of slots without losing or reordering an event. It is pure logic:
// no I/O, no logging, no clock. The caller (the pipeline) owns connections.
//
// A shard is a slot and a publication. Shard i of n publishes only the
// outbox rows whose key column hashes to i (a Postgres 15 row filter); with
// several outbox tables the publication lists each (Table) with a filter on
// its own key column. So every row belongs to exactly one shard, and every
// key's events keep their order.
//
// The hash is Postgres' hashtext(key), read as an unsigned 32-bit integer,
// modulo n: Expr in SQL, Of in Go. Postgres computes every row's shard
// itself, in the row filters, so delivery never depends on Go agreeing: for
// a given n a key's shard cannot change within one database (a physical
// standby has the primary's architecture). Only outboxd's own uses of Of need Go to agree:
// routing logical messages (MessageOwner) and the tests.
//
// Why hashtext is stable: on a deterministic collation it is hash_bytes
// (Bob Jenkins' lookup3, src/common/hashfn.c) over the value's bytes,
// unchanged since Postgres 8.4, and hash indexes (and, through its extended
// variant, hash partitions) keep its results across pg_upgrade, so Postgres
// cannot change it between major versions without breaking them. It does
// differ on big-endian servers, under nondeterministic collations (it hashes
// the collation's sort key) and, for non-ASCII keys, outside UTF8 databases
// (it hashes the database encoding's bytes). Hashtext ports the
// little-endian hash_bytes; the probe (KeyColumnSQL, ProbeCollatedSQL,
// VerifyProbe) finds the other cases at start-up, and outboxd then refuses
// more than one shard. hashtext is an immutable built-in, so a row filter
// may call it.
//
// The caller's duties:
//
//  1. Validate the layout with Names for the configured slot and
//     publication names (63-byte identifiers) and refuse n > 1 before
//     Postgres 15 (MinVersion).
//  2. Before using more than one shard, check the hash: run KeyColumnSQL
//     for each table's key column and refuse what KeyColumnError returns;
//     run ProbeCollatedSQL with each column's collation (its error through
//     ProbeError) and refuse what VerifyProbe returns. Then run
//     PublicationSQL of every table for each missing publication
//     (PublicationError). Check each table's filter of an existing one
//     (FilterCheckSQL, FilterCheckError); fix one only with
//     RefilterStatements of the tables to fix, in one transaction, which
//     touches no other table of the publication.
//     Shard publications publish inserts only (Publish explains why).
//  3. Route logical-decoding messages, which no publication filters, with
//     MessageOwner: each shard delivers only its own.
//  4. Drive start-up and resharding with Next: observe (the row of the
//     state table of StateTableSQL, the slots, the publications), perform
//     the Action, and observe again, until Next says Stream. Each Action is
//     idempotent and may be cut short by a kill; Next resumes or rolls back
//     from whatever is left. Two instances may run the loop at once (an HA
//     pair): write the row's phase only from the phase Next saw (UPDATE ...
//     WHERE phase = ...), treat "already exists" and "does not exist" from
//     a create or drop as done, and observe again after any error.
//  5. Run an old shard during a reshard with the Action's Window: deliver a
//     transaction only if Window.Delivers its end LSN; at the first one
//     Window.Past, deliver nothing more and, once everything before it is
//     acknowledged, confirm Window.Upto (that transaction proves the slot
//     holds nothing else up to there, as a keepalive's WAL end does for an
//     idle stream); never confirm beyond Window.Confirm; stop when
//     Window.Done.
//  6. Give each shard its own tracker, confirmations and, with exactly-once
//     delivery, its own transactional id and position (the slot name
//     differs per shard, so outboxd-<system id>-<slot> does).
package shard
