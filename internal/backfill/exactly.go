package backfill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outboxd/internal/eos"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// This file is the backfill in kafka.delivery: exactly_once (DESIGN.md,
// "Backfill", "Exactly-once"): its rows go out in Kafka transactions of the
// slot's transactional producer, and each transaction writes, in the same
// transaction, the backfill's cursor into the id's position record
// (eos.Position.Backfill). A resumed run starts after the cursor Kafka
// committed, not after the one saved in Postgres, which may lag: a row is in
// Kafka read_committed exactly once across kills.

// Committed is what an exactly-once backfill starts from on the Kafka side:
// whose positions it writes (the slot and the system identifier, under the
// transactional id), and the position that id last committed, read
// read_committed after the producer's Init (found is false when there is
// none).
type Committed struct {
	Owner    eos.Owner
	Position eos.Position
	Found    bool
	// Server is the server's timeline and WAL end as IDENTIFY_SYSTEM read
	// them before the producer's Init: a stream position from an earlier
	// timeline was written before a promotion or a restore, not by a
	// process streaming this slot (zero: not known).
	Server eos.Server
}

// cursor is the backfill's progress as a Kafka transaction commits it: which
// backfill (the slot's consistent point and the backfill's start, from its
// State), the key of the last row in Kafka with every row before it in the
// key order, the rows in Kafka, and whether they are all of them.
type cursor struct {
	LSN     string    `json:"lsn"`
	Started time.Time `json:"started"`
	After   []string  `json:"after"`
	Sent    int64     `json:"sent"`
	Done    bool      `json:"done,omitempty"`
}

// cursorOf is the cursor of st, all of whose rows are in Kafka when done.
func cursorOf(st State, done bool) string {
	b, _ := json.Marshal(cursor{LSN: st.LSN, Started: st.Started, After: st.Done, Sent: st.Sent, Done: done})
	return string(b)
}

// resumed is where an exactly-once backfill goes on from.
type resumed struct {
	State // with Done and Sent as Kafka committed them, when Kafka is ahead
	// finished: Kafka holds every row (the last transaction said done)
	// and Postgres does not know yet: record done, send nothing.
	finished bool
	// fromKafka: the cursor came from Kafka.
	fromKafka bool
	// note, when not "", says why Kafka's cursor was not taken, for the
	// log.
	note string
}

// resume decides where the backfill whose state Postgres holds in s (st)
// goes on from, given the position its transactional id last committed in
// Kafka (k). Postgres saves a cursor only after
// Kafka committed it, and not after every commit: Kafka's is the later one,
// and wins. Postgres's is taken when Kafka holds no cursor of this backfill:
// none at all (the backfill began in at_least_once, or under another
// kafka.transactional_id, or an operator wrote a tombstone), a stream
// position of an earlier slot of the same name (below this slot's
// consistent point, or written on an earlier timeline than the server's:
// before a promotion or a restore), or another backfill's
// cursor, of an earlier slot of the same name (the slot's consistent point
// or the backfill's start differ), or, which no run of outboxd writes, one
// behind Postgres's. A stream position on the server's timeline (or of
// none recorded) at or past the consistent point is refused
// (StreamedError): another process streamed the slot.
func resume(st State, k Committed, s store) (resumed, error) {
	pos := k.Position
	var note string
	if k.Found && pos.Backfill == "" && pos.LSN > 0 {
		// While a backfill is not done nothing may stream its slot: a
		// stream position of this slot at or past the slot's consistent
		// point was written by a second writer that streamed it (one that
		// started without postgres.backfill). One below it is an earlier
		// slot's of the same name, and is passed over; so is one of an
		// earlier timeline, which the cluster wrote before a promotion or
		// a point-in-time restore (the system identifier survives both,
		// the slot does not; review-fix55 Should 2).
		start, err := wal.ParseLSN(st.LSN)
		if err != nil {
			return resumed{}, &StateError{fmt.Errorf("the backfill of slot %q recorded in %s has a consistent point %q that is not an LSN (%w): "+
				"outboxd did not write it, and a restart reads it again. Write the slot's consistent point back into the state (the lsn key of the state column): "+
				"it is the lsn of outboxd's log line \"created replication slot with the backfill's snapshot\" for slot %[1]s (while nothing has streamed the slot, also its confirmed_flush_lsn in pg_replication_slots); "+
				"or give the backfill up: DELETE FROM %[5]s WHERE slot = '%[1]s'; DROP TABLE IF EXISTS %[6]s; remove postgres.backfill, and send the rows not sent with outboxd replay",
				st.Slot, s.name, st.LSN, err, s.state, s.keys)}
		}
		older := pos.Timeline != 0 && k.Server.Timeline != 0 && pos.Timeline < k.Server.Timeline
		switch {
		case pos.LSN >= start && !older:
			return resumed{}, streamed(st, k, start, s)
		case pos.LSN >= start:
			note = fmt.Sprintf("transactional id %q last committed a stream position at %s on timeline %d, an earlier one than the server's (%d): "+
				"the cluster's before a promotion or a restore, not this slot's; it is passed over", k.Owner.ID, pos.LSN, pos.Timeline, k.Server.Timeline)
		}
	}
	if !k.Found || pos.Backfill == "" {
		r := resumed{State: st, note: note}
		if st.Sent > 0 {
			r.note = strings.TrimPrefix(note+"; ", "; ") + "Kafka holds no cursor of a backfill under this transactional id (the backfill began in at_least_once, or under another kafka.transactional_id): " +
				"going on after the rows Postgres recorded; rows Kafka committed after them are sent again"
		}
		return r, nil
	}
	var c cursor
	if err := json.Unmarshal([]byte(pos.Backfill), &c); err != nil {
		return resumed{}, &CursorError{fmt.Errorf("the backfill cursor in the position of transactional id %q in %s is not outboxd's (%q): %w; "+
			"it decides which rows are in Kafka: delete the key's records from %[2]s only if nothing else writes under that id (the backfill then goes on after the rows Postgres recorded, "+
			"and sends again those Kafka committed after them)", k.Owner.ID, k.Owner.Topic, pos.Backfill, err)}
	}
	switch {
	case c.LSN != st.LSN || !c.Started.Equal(st.Started):
		return resumed{State: st, note: fmt.Sprintf("the backfill cursor in Kafka is another backfill's (slot made at %s, started %s; this one's slot was made at %s, started %s): "+
			"it is passed over, and the backfill goes on after the rows Postgres recorded", c.LSN, c.Started.Format(time.RFC3339Nano), st.LSN, st.Started.Format(time.RFC3339Nano))}, nil
	case c.Sent < st.Sent:
		return resumed{State: st, note: fmt.Sprintf("the backfill cursor in Kafka (%d rows) is behind the one Postgres recorded (%d rows), which Postgres records only after Kafka committed it: "+
			"the position record was replaced; going on after the rows Postgres recorded", c.Sent, st.Sent)}, nil
	}
	st.Done, st.Sent = slices.Clone(c.After), c.Sent
	return resumed{State: st, finished: c.Done, fromKafka: true}, nil
}

// streamed is the StreamedError of a stream position of the backfill's
// slot at or past its consistent point start, on the server's timeline.
// The position stays the id's last record, and is read again at every
// restart, until something writes over it: the message gives the two ways
// out (review-fix55 Should 1).
func streamed(st State, k Committed, start wal.LSN, s store) error {
	pos := k.Position
	why := "another outboxd process streamed the slot while this backfill had rows still to send, and their events may be out of order for their keys"
	if k.Server.WALEnd != 0 && pos.LSN > k.Server.WALEnd {
		why = fmt.Sprintf("it is past the server's WAL end at this start (%s): another outboxd process streams the slot now, while this backfill has rows still to send, "+
			"or the database was restored from a copy without a new timeline (a disk snapshot) and the position is from before", k.Server.WALEnd)
	}
	return &StreamedError{fmt.Errorf("the backfill of slot %q is not done, but transactional id %q committed a stream position of the slot at %s (timeline %d), at or past the slot's consistent point %s, in %s: %s. "+
		"A restart reads the same position again. Stop every process that streams slot %[1]q without postgres.backfill, then choose: "+
		"(a) finish the backfill: write a tombstone for key %[2]q to %[6]s (a record of that key with a null value, e.g. echo '%[2]s:' | kcat -P -b <brokers> -t %[6]s -K: -Z) "+
		"and start this process again; it goes on after the rows Postgres recorded in %[8]s (rows Kafka committed after them are sent again), and the stream that follows it "+
		"sends again what the other process committed to Kafka but did not confirm to the slot. "+
		"(b) give up the rows not sent: DELETE FROM %[9]s WHERE slot = '%[1]s'; DROP TABLE IF EXISTS %[10]s; remove postgres.backfill, start outboxd, "+
		"and send those rows with outboxd replay. Either way the keys whose events the other process sent before this backfill's rows have lost their order",
		st.Slot, k.Owner.ID, pos.LSN, pos.Timeline, start, k.Owner.Topic, why, s.name, s.state, s.keys)}
}

// StreamedError is a stream position of the backfill's slot, in Kafka,
// past the slot's consistent point: another process streamed the slot
// while the backfill was not done (review-eosbf S2). A restart would read
// it again; the message says what to write or delete instead.
type StreamedError struct{ err error }

func (e *StreamedError) Error() string { return e.err.Error() }
func (e *StreamedError) Unwrap() error { return e.err }

// Permanent reports that a restart cannot fix it.
func (e *StreamedError) Permanent() bool { return true }

// CursorError is a backfill cursor in the positions topic that is not
// outboxd's: a restart would read it again.
type CursorError struct{ err error }

func (e *CursorError) Error() string { return e.err.Error() }
func (e *CursorError) Unwrap() error { return e.err }

// Permanent reports that a restart cannot fix it.
func (e *CursorError) Permanent() bool { return true }

// StateError is a backfill state row in Postgres that outboxd did not
// write (review-fix55 N6): a restart would read it again.
type StateError struct{ err error }

func (e *StateError) Error() string { return e.err.Error() }
func (e *StateError) Unwrap() error { return e.err }

// Permanent reports that a restart cannot fix it.
func (e *StateError) Permanent() bool { return true }

// split reports whether an open Kafka transaction of records records and
// bytes bytes, open for age, commits before the next row, as the stream's
// would split a Postgres transaction: at kafka.max_buffered_records, at
// kafka.transaction_max_bytes, or at half of the transaction and delivery
// timeouts (eos.LimitsOf), so that Kafka never aborts it for its age.
func split(records, bytes int, age time.Duration, l eos.Limits) bool {
	return records >= l.MaxRecords || bytes >= l.MaxBytes || age >= l.MaxAge
}

// txns is an exactly-once backfill's Kafka side: the transactional producer,
// initialised after the backfill was locked, and its open transaction.
type txns struct {
	p              *sink.Producer
	owner          eos.Owner
	limits         eos.Limits
	opened         time.Time
	records, bytes int
}

// add counts a record of size bytes produced at now, opening a Kafka
// transaction first when none is.
func (t *txns) add(now time.Time, size int) error {
	if !t.p.InTransaction() {
		if err := t.p.Begin(); err != nil {
			return err
		}
		t.opened, t.records, t.bytes = now, 0, 0
	}
	t.records++
	t.bytes += size
	return nil
}

// due reports whether the open Kafka transaction commits before the next
// row (split).
func (t *txns) due(now time.Time) bool {
	return t.p.InTransaction() && split(t.records, t.bytes, now.Sub(t.opened), t.limits)
}

// commit commits the open Kafka transaction with the cursor c in the
// position record: LSN 0, no stream position (eos.Position.Backfill).
func (t *txns) commit(ctx context.Context, c string) error {
	pos := eos.Position{Slot: t.owner.Slot, System: t.owner.System, Backfill: c}
	return t.p.Commit(ctx, pos.Encode(time.Now()))
}

// end ends the backfill's run with err: it aborts the Kafka transaction
// left open (Kafka would abort it only at kafka.transaction_timeout, holding
// read_committed consumers back until then), and tells a run that ended
// because another instance fenced it.
func (t *txns) end(ctx context.Context, err error) error {
	if err == nil && !t.p.InTransaction() {
		return nil
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err = t.p.AsFenced(err)
	var fenced *sink.FencedError
	if err != nil && !errors.As(err, &fenced) && ctx.Err() == nil {
		// Under transactions version 1 a fenced write may be answered
		// INVALID_TXN_STATE: ask the coordinator.
		if newer, askErr := t.p.Fenced(actx); askErr == nil && newer {
			err = &sink.FencedError{TransactionalID: t.p.TransactionalID(), Err: err}
		}
	}
	abortErr := t.p.Abort(actx)
	if err == nil {
		err = abortErr
	}
	return err
}
