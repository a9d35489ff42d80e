// Package wal reads an outbox table's changes from a Postgres logical
// replication slot with the pgoutput plugin (protocol version 1).
//
// It has two layers:
//
//   - Decoder turns pgoutput message bytes into typed messages (Begin,
//     Change, Commit, Message) and checks that they arrive in a valid order.
//     They and Stream's Keepalive are the closed set of Items that a stream
//     hands on.
//     It owns no connection, logger or clock; its state (the relation cache
//     and the open transaction) belongs to one stream.
//   - Stream owns the replication connection. One goroutine (the one calling
//     Run) receives, decodes and hands messages on, and sends every standby
//     status update itself: a keepalive every StatusInterval, the confirmed
//     position as soon as it advances (at most once per ConfirmInterval), at
//     once when the server asks, and a final one on shutdown. Other
//     goroutines only publish the confirmed position, through the position
//     function given to it.
//
// The caller's duties:
//
//  1. Check the slot and publication (Inspect*, Ensure*) before streaming.
//  2. Consume every item Stream.Run sends, in order, and keep the position
//     function honest: it must return only a position whose transactions are
//     all delivered (package checkpoint computes it).
//  3. After Run returns, call Close, which sends the final status update.
//     Give Close's ctx a deadline, and set SlotPosition first, reading
//     pg_replication_slots on a connection that is not this one: without
//     it, Close reads until the server ends the stream, which in a large
//     transaction can take longer than the deadline, and the update is lost
//     when the connection closes.
//
// Errors classify themselves: ErrSlotMissing, ErrSlotLost and
// ErrPublicationMissing (matched with errors.Is) and DecodeError report
// Permanent() true, the first two SlotGone() true too; an Error carries
// what to do apart from what is wrong, in its Hint.
//
// Bytes handed out by the decoder (column values, message content) alias one
// copy of the message made by the stream and stay valid after later reads.
package wal
