package eos

import (
	"time"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/wal"
)

// Limits are when the Machine commits or splits a Kafka transaction.
type Limits struct {
	// MaxRecords is kafka.max_buffered_records: a Kafka transaction that
	// holds this many records commits at the next boundary, and one commits
	// before a Begin when the caller's tracker holds MaxRecords-1 unconfirmed
	// Postgres transactions (only a commit makes room there).
	MaxRecords int
	// MaxBytes is kafka.transaction_max_bytes: a Postgres transaction is
	// split before a row when the open Kafka transaction holds this many
	// bytes of records.
	MaxBytes int
	// Interval is kafka.transaction_interval: under load a Kafka
	// transaction commits at a boundary once it is this old.
	Interval time.Duration
	// MaxAge is how long a Kafka transaction may stay open inside a
	// Postgres transaction before the Postgres transaction is split.
	MaxAge time.Duration
}

// LimitsOf returns the limits kafka configures. MaxAge is half the
// transaction timeout, and half the delivery timeout, since the stall
// watchdog counts the wait of the Postgres transactions a Kafka
// transaction completed.
func LimitsOf(k config.Kafka) Limits {
	return Limits{MaxRecords: k.MaxBufferedRecords, MaxBytes: k.TransactionMaxBytes, Interval: k.TransactionInterval,
		MaxAge: min(k.TransactionTimeout, k.DeliveryTimeout) / 2}
}

// Step is what the caller does for one input, in this order: leave the
// item out (Skip), or commit the open Kafka transaction writing Position
// (Commit), release the holds of the Release oldest completed Postgres
// transactions, and open a Kafka transaction (Open), before the row.
type Step struct {
	Skip     bool
	Commit   bool
	Position Position
	Release  int
	Open     bool
}

// Machine is one run's exactly-once state. Its zero value is not usable:
// create it with New. It is not safe for concurrent use.
type Machine struct {
	limits Limits
	stream Position // the slot, system and timeline written with each position
	resume Position // the position the run resumes from (Resume)

	// last is the end LSN of the last Postgres transaction completed, or the
	// run's confirmed start.
	last wal.LSN
	// completed counts the Postgres transactions completed since the last
	// commit, whose holds the next commit releases.
	completed int

	// The open Kafka transaction.
	open           bool
	opened         time.Time
	records, bytes int

	// The Postgres transaction being received.
	inTxn     bool
	final     wal.LSN // its commit LSN
	rows      int     // its rows met so far, in earlier Kafka transactions and runs too
	skipRows  int     // its rows a previous run put in Kafka, still to skip
	skipWhole bool    // it ends at or before the resumed position: skip it whole
}

// New returns the Machine of a run that resumes from resume (Resume's
// position; the zero Position without one) and whose tracker confirmed
// confirmed once resume was applied to it. slot, system and timeline are
// written with each position.
func New(limits Limits, slot, system string, timeline int, resume Position, confirmed wal.LSN) *Machine {
	return &Machine{limits: limits, stream: Position{Slot: slot, System: system, Timeline: timeline}, resume: resume, last: confirmed}
}

// Begin is a Postgres transaction's Begin, whose commit record starts at
// final; pending is how many transactions the caller's tracker holds
// unconfirmed. The transaction is skipped whole when it ends at or before
// the resumed position (its commit starts before it); the rows of the split
// transaction the position names are counted, and its first Rows skipped
// (Row).
func (m *Machine) Begin(final wal.LSN, pending int) Step {
	if final < m.resume.LSN {
		m.skipWhole = true
		return Step{Skip: true}
	}
	m.inTxn, m.final, m.rows, m.skipRows = true, final, 0, 0
	if m.resume.Txn != 0 && final == m.resume.Txn {
		m.skipRows = m.resume.Rows
	}
	if pending >= m.limits.MaxRecords-1 {
		return m.commit()
	}
	return Step{}
}

// Skipping reports whether the transaction being received is skipped
// whole: until its Commit, every item of it is left out.
func (m *Machine) Skipping() bool { return m.skipWhole }

// Row is a row of the transaction being received, of size bytes, met at
// now, before it is produced. It is skipped when a previous run put it in
// Kafka. Otherwise, when the open Kafka transaction is too large or too old,
// it commits first with a split marker counting the transaction's rows
// before this one; and a Kafka transaction is opened when none is.
func (m *Machine) Row(now time.Time, size int) Step {
	if m.skipWhole {
		return Step{Skip: true}
	}
	m.rows++
	if m.skipRows > 0 {
		m.skipRows--
		return Step{Skip: true}
	}
	var s Step
	if m.open && (m.bytes >= m.limits.MaxBytes || now.Sub(m.opened) >= m.limits.MaxAge) {
		m.rows-- // this one goes in the next Kafka transaction
		s = m.commit()
		m.rows++
	}
	if !m.open {
		m.open, m.opened = true, now
		s.Open = true
	}
	m.records++
	m.bytes += size
	return s
}

// Commit is the Commit of the transaction being received, which ends at
// end. Its hold is released with the next Kafka commit, or at once when no
// Kafka transaction is open (it had no row since the last commit).
func (m *Machine) Commit(end wal.LSN) Step {
	if m.skipWhole {
		m.skipWhole = false
		return Step{Skip: true}
	}
	m.inTxn, m.skipRows = false, 0
	m.last = end
	m.completed++
	if !m.open {
		return m.release()
	}
	return Step{}
}

// Boundary is a Postgres transaction boundary at now (before a Begin,
// after a Commit, after a batch); waiting tells whether a complete
// Postgres transaction may be waiting behind it (a later Commit in the
// batch, or another batch queued). Outside a Postgres transaction the open
// Kafka transaction commits when CommitDue says so.
func (m *Machine) Boundary(now time.Time, waiting bool) Step {
	if m.inTxn || !m.open || !CommitDue(m.records, now.Sub(m.opened), waiting, m.limits) {
		return Step{}
	}
	return m.commit()
}

// CommitDue decides whether a Kafka transaction of records records, open
// for age, commits at a Postgres transaction boundary. With no complete
// Postgres transaction waiting behind it, it commits at once: a quiet
// stream's events become visible a commit's round trip after they arrive,
// not kafka.transaction_interval later. Under load (transactions waiting)
// it keeps batching until it is Interval old or holds MaxRecords records,
// which holds the throughput: each commit then carries what arrived while
// the previous one was made, up to those limits.
func CommitDue(records int, age time.Duration, waiting bool, limits Limits) bool {
	return !waiting || records >= limits.MaxRecords || age >= limits.Interval
}

// Due returns when the caller must Tick if nothing arrives: when the open
// Kafka transaction is due for a commit (Interval old), or, inside a
// Postgres transaction, for a split (MaxAge old). ok is false when no
// Kafka transaction is open.
func (m *Machine) Due() (at time.Time, ok bool) {
	switch {
	case !m.open:
		return time.Time{}, false
	case m.inTxn:
		return m.opened.Add(m.limits.MaxAge), true
	}
	return m.opened.Add(m.limits.Interval), true
}

// Tick is the clock at now with nothing arriving: the open Kafka
// transaction commits when it is Due, inside a Postgres transaction with a
// split marker.
func (m *Machine) Tick(now time.Time) Step {
	if at, ok := m.Due(); !ok || now.Before(at) {
		return Step{}
	}
	return m.commit()
}

// Finish is the end of a stream that stopped cleanly: what the run
// completed commits, unless the stream stopped inside a Postgres
// transaction (the caller aborts then).
func (m *Machine) Finish() Step {
	if m.inTxn {
		return Step{}
	}
	return m.commit()
}

// commit commits the open Kafka transaction with the position, and
// releases the holds of the Postgres transactions it completed. Inside a
// Postgres transaction (a split) the position says how many of its rows
// are in Kafka.
func (m *Machine) commit() Step {
	if !m.open {
		return m.release()
	}
	pos := m.stream
	pos.LSN = m.last
	if m.inTxn && m.rows > 0 {
		pos.Txn, pos.Rows = m.final, m.rows
	}
	m.open, m.records, m.bytes = false, 0, 0
	s := m.release()
	s.Commit, s.Position = true, pos
	return s
}

// release releases the holds of the completed transactions.
func (m *Machine) release() Step {
	n := m.completed
	m.completed = 0
	return Step{Release: n}
}
