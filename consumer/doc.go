// Package consumer applies Kafka records written by outboxd to a database
// effectively once: each record's effects and a row recording its event id
// commit in one database transaction, and the Kafka offset is committed only
// after that transaction.
//
// For each record, in partition order, a Consumer:
//
//  1. reads the event id from the header "id" (Config.IDHeader);
//  2. begins a transaction and runs
//     INSERT INTO processed_events (consumer, event_id) … ON CONFLICT DO NOTHING;
//     if the row was already there the event was applied before (a
//     redelivery, or a replay after a crash): the transaction is rolled back
//     and the record is skipped;
//  3. calls the Handler with that transaction, then commits it;
//  4. after every record of a poll is handled, commits their offsets.
//
// A crash anywhere repeats at most the records after the last offset commit,
// and step 2 skips those whose transaction committed. Delivery into the
// consumer is at-least-once; effects are applied once.
//
// # Failures
//
// A Handler error (or a failed commit) rolls the transaction back and the
// record is tried again after a back-off (Config.Backoff, doubling up to
// Config.MaxBackoff), up to Config.MaxAttempts times in all. Then the record
// is produced to Config.DeadLetterTopic with its key, value and headers plus
// the headers dlt.error (the last error), dlt.attempts, dlt.topic,
// dlt.partition, dlt.offset and dlt.consumer, and consumption goes on. A
// record without an id header goes to the dead-letter topic at once. No
// record is skipped silently: if the dead-letter produce fails, Run returns
// the error and the offset is not committed.
//
// Errors of the database itself (Begin, or the processed-events insert) are
// not the record's fault and never dead-letter it: after MaxAttempts Run
// returns the error, with the offsets of the records handled before it
// committed. A dead-lettered record is not recorded as processed, so it can
// be replayed from the dead-letter topic once fixed; consumers of the
// dead-letter topic should expect a repeat after a crash.
//
// # Retention
//
// The processed-events table grows by one row per event. With
// Config.Retention set, Run deletes this consumer's rows older than that
// every Config.RetentionInterval; Prune does the same on demand. The window
// must be longer than any redelivery can be late: at least the time a crash
// of outboxd or of this consumer can stay unnoticed plus the topic's
// retention if offsets may be reset. A redelivered event whose row was
// already deleted is applied again.
//
// # The caller's duties
//
//  1. Create the processed-events table (CreateTable) in the database the
//     handler writes to, and the dead-letter topic (Run checks that it
//     exists unless Config.KafkaOpts allow auto-creation).
//  2. Write all of a record's effects through the given transaction, and
//     nothing outside it that must not repeat. The handler must not commit
//     or roll back the transaction.
//  3. Return an error for a failure worth retrying or dead-lettering; a
//     record that must be ignored is handled by returning nil.
//  4. Keep handlers shorter than the group's rebalance timeout divided by
//     MaxAttempts: rebalances wait while a poll is being handled.
//  5. Call Run, then Close.
package consumer
