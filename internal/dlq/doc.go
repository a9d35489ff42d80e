// Package dlq reads and redrives outboxd's dead-letter topic
// (router.poison.dlq_topic): the "outboxd dlq list" and "outboxd dlq
// redrive" commands.
//
// A dead letter is the record the relay wrote for a poison row: the row's
// key, payload and headers (the id header among them) plus the headers
// outboxd.error.reason, outboxd.source.lsn, outboxd.source.table and
// outboxd.intended.topic, the names of its id and event type headers in
// outboxd.dlq.id.header and outboxd.dlq.event.type.header (they may differ
// per outbox table; a dead letter written before outboxd recorded them is
// read with the configured router.id_header), and outboxd.payload.dropped or
// outboxd.headers.dropped when it had to leave something out. A row that
// routing refused has no record: its dead letter holds the row's key and
// payload columns, the id and event type headers, and
// outboxd.record.unbuilt, and redrive leaves it to outboxd replay.
//
// Redrive keeps its own bookkeeping in the dead-letter topic itself, so
// that a second run does not send again what a first one sent, and a killed
// run resumes:
//
//   - a marker (header outboxd.dlq.redriven = "PARTITION/OFFSET", no value)
//     is written to the dead letter's partition once its record is in the
//     intended topic;
//   - a dead letter that still fails is written again with the new reason
//     and the header outboxd.dlq.supersedes = "PARTITION/OFFSET" of the one
//     it replaces.
//
// A dead letter is pending while no later record of its partition with its
// event id refers to it. In kafka.delivery: exactly_once the redriven
// records, their markers and the rewritten dead letters of a batch go in
// one Kafka transaction (transactional id "outboxd-dlq-redrive-" + the
// topic), so a read_committed consumer sees each redriven record once, and
// the topic is read with read_committed. In at_least_once the marker follows the
// record's acknowledgement: a run killed between the two sends that record
// again at the next run, with the same id header.
//
// The caller's duties:
//
//  1. Pass the daemon's configuration: the Kafka settings (brokers, TLS,
//     SASL, delivery), and the top-level router.id_header and
//     router.event_type_header for dead letters that do not name theirs.
//  2. Run one redrive of a topic at a time (in exactly_once a second run
//     fences the first, which ends with a *sink.FencedError; in
//     at_least_once two runs may both send a record).
//  3. Fix the cause first: a dead letter that fails again stays pending
//     with the new reason.
package dlq
