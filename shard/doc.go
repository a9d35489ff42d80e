// Package shard splits one outbox table's stream over several replication
// slots, so that several walsenders decode it in parallel, and changes the
// number of slots without losing or reordering an event. It is pure logic:
// no I/O, no logging, no clock. The caller (the pipeline) owns connections.
//
// A shard is a slot and a publication. Shard i of n publishes only the
// outbox rows whose key column hashes to i (a Postgres 15 row filter), so
// every key belongs to exactly one shard and its events keep their order.
//
// The hash is the first four bytes of md5(key), big-endian, modulo n: Of in
// Go, Expr in SQL. md5(text) is an immutable built-in function whose result
// is defined by RFC 1321, so every Postgres version and platform computes
// the same shard; hashtext() is not documented to be stable across either.
// Postgres hashes the column's bytes in the database encoding, so Of agrees
// with it for non-ASCII keys only in a UTF8 database. The filter is
// evaluated only while decoding, never in the application's INSERT; a
// server that refuses MD5 (FIPS mode) would accept the publications and
// fail in every walsender, which ProbeSQL turns into an error at creation.
//
// The caller's duties:
//
//  1. Validate the layout with Names for the configured slot and
//     publication names (63-byte identifiers) and refuse n > 1 before
//     Postgres 15 (MinVersion).
//  2. Before creating shard publications run ProbeSQL (ProbeError), then
//     PublicationSQL for each missing one (PublicationError). Shard
//     publications publish inserts only (Publish explains why).
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
