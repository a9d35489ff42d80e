// Package preflight holds outboxd's start-up checks and the inspection of
// the replication slot before each pipeline run, and what they learn of the
// slot's history.
//
// A Checker, made once per slot from the configuration, holds no state of
// its own. Its caller (package relay's supervisor):
//
//  1. calls Check once at start-up with the zero History: it checks the
//     server, the role, the outbox table and its column types, prepares the
//     publication and the slot, checks that a Kafka broker answers, and
//     returns a Checked value: the router.Schema the router is built from,
//     the slot's History, and the connections and warmed Kafka client for
//     the first pipeline, which the caller takes over or closes (Close);
//  2. keeps the History as the one value passed, by pointer, to every
//     inspection of the slot (Inspect, InspectOn, RefuseSplitBrain) and to
//     JudgeGone, and records in it what each run confirmed
//     (History.Confirmed): a promotion is told from a dropped slot, and an
//     old primary from the new one, by what earlier runs saw;
//  3. streams from the server the inspection read the slot on (Slot.Addr)
//     and nowhere else.
//
// Every error says what is wrong and what to do. A server's errors are
// judged by SQLSTATE and a fresh read of the catalogue, never by message
// text.
package preflight
