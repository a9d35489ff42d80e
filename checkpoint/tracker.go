package checkpoint

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

// Tracker tracks transactions in commit order and computes the highest
// position that is safe to confirm. See the package documentation.
type Tracker struct {
	mu        sync.Mutex
	queue     []*Txn // transactions not yet confirmed, in commit order
	head      int    // index of the first live entry in queue
	confirmed pglogrepl.LSN
	// confirmedAt is the commit time of the last confirmed transaction;
	// confirmedTxns counts confirmed transactions.
	confirmedAt   time.Time
	confirmedTxns uint64
	inFlight      int           // records added and not yet acknowledged
	idle          chan struct{} // made by WaitAcked, closed when inFlight drops to 0
	room          chan struct{} // made by WaitRoom, closed when a transaction is confirmed
	// headSince is when the oldest unconfirmed transaction became the
	// oldest: from then on no earlier record is ahead of its records.
	headSince time.Time
}

// Txn is one transaction inside a Tracker.
type Txn struct {
	t         *Tracker
	pending   int
	committed bool
	end       pglogrepl.LSN
	at        time.Time
	handed    time.Time // when Commit was called: every record handed over
}

// New returns a Tracker whose confirmed position starts at start.
func New(start pglogrepl.LSN) *Tracker {
	return &Tracker{confirmed: start}
}

// Begin opens the next transaction in commit order.
func (t *Tracker) Begin() *Txn { return t.BeginAt(time.Time{}) }

// BeginAt opens the next transaction in commit order, committed at the given
// time (reported by Position once it is confirmed).
func (t *Tracker) BeginAt(commitTime time.Time) *Txn {
	x := &Txn{t: t, at: commitTime}
	t.mu.Lock()
	if t.head == len(t.queue) {
		t.headSince = time.Now()
	}
	t.queue = append(t.queue, x)
	t.mu.Unlock()
	return x
}

// Add records that one more record of x was handed to the producer.
func (x *Txn) Add() {
	t := x.t
	t.mu.Lock()
	x.pending++
	t.inFlight++
	t.mu.Unlock()
}

// Ack records that one record of x was acknowledged by Kafka.
func (x *Txn) Ack() {
	t := x.t
	t.mu.Lock()
	if x.pending <= 0 {
		t.mu.Unlock()
		panic("checkpoint: Ack without a matching Add")
	}
	x.pending--
	t.inFlight--
	if t.inFlight == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
	if x.pending == 0 && x.committed {
		t.advance()
	}
	t.mu.Unlock()
}

// Commit closes x: all its records have been added, and end is the end LSN
// of its commit record.
func (x *Txn) Commit(end pglogrepl.LSN) {
	t := x.t
	t.mu.Lock()
	x.committed = true
	x.end = end
	if x.pending == 0 {
		t.advance()
	} else {
		x.handed = time.Now()
	}
	t.mu.Unlock()
}

// advance pops every fully acknowledged committed transaction from the front
// of the queue. The caller holds t.mu.
func (t *Tracker) advance() {
	first := t.head
	for t.head < len(t.queue) {
		x := t.queue[t.head]
		if !x.committed || x.pending > 0 {
			break
		}
		if x.end > t.confirmed {
			t.confirmed = x.end
		}
		if !x.at.IsZero() {
			t.confirmedAt = x.at
		}
		t.confirmedTxns++
		t.queue[t.head] = nil
		t.head++
	}
	if t.head != first && t.head < len(t.queue) {
		t.headSince = time.Now() // a new oldest transaction
	}
	if t.head != first && t.room != nil {
		close(t.room)
		t.room = nil
	}
	if t.head == len(t.queue) {
		t.queue = t.queue[:0]
		t.head = 0
	} else if t.head > 1024 && t.head*2 > len(t.queue) {
		n := copy(t.queue, t.queue[t.head:])
		clear(t.queue[n:])
		t.queue = t.queue[:n]
		t.head = 0
	}
}

// Idle advances the confirmed position to walEnd when no transaction is open
// or waiting for acknowledgements. It reports whether it did.
func (t *Tracker) Idle(walEnd pglogrepl.LSN) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.head < len(t.queue) || walEnd <= t.confirmed {
		return false
	}
	t.confirmed = walEnd
	return true
}

// Waiting returns since when the oldest unconfirmed transaction has both
// had every record handed over and been the oldest, if it waits for Kafka to
// acknowledge some of them, and the zero time otherwise. From then on no
// earlier record is queued ahead of its records, so a long wait is a
// partition that does not move, even while others are acknowledged; a full
// buffer draining slowly does not count against it.
func (t *Tracker) Waiting() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.head < len(t.queue) {
		if x := t.queue[t.head]; x.committed {
			if x.handed.After(t.headSince) {
				return x.handed
			}
			return t.headSince
		}
	}
	return time.Time{}
}

// Confirmed returns the highest position that is safe to confirm.
func (t *Tracker) Confirmed() pglogrepl.LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.confirmed
}

// Position returns the confirmed position, the commit time of the last
// confirmed transaction (zero if unknown), and how many transactions this
// tracker has confirmed.
func (t *Tracker) Position() (lsn pglogrepl.LSN, commitTime time.Time, txns uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.confirmed, t.confirmedAt, t.confirmedTxns
}

// InFlight returns the number of records added and not yet acknowledged.
func (t *Tracker) InFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inFlight
}

// Pending returns the number of transactions not yet confirmed.
func (t *Tracker) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.queue) - t.head
}

// WaitRoom blocks while max or more transactions are not yet confirmed, or
// until ctx is done. Called before Begin, it bounds the queue: a partition
// that does not move holds back every later transaction, even those whose
// records are all acknowledged (or that have none), and the reader waits
// instead of the queue growing.
func (t *Tracker) WaitRoom(ctx context.Context, max int) error {
	for {
		t.mu.Lock()
		if len(t.queue)-t.head < max {
			t.mu.Unlock()
			return nil
		}
		if t.room == nil {
			t.room = make(chan struct{})
		}
		ch := t.room
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WaitAcked blocks until no record is in flight or ctx is done.
func (t *Tracker) WaitAcked(ctx context.Context) error {
	for {
		t.mu.Lock()
		if t.inFlight == 0 {
			t.mu.Unlock()
			return nil
		}
		if t.idle == nil {
			t.idle = make(chan struct{})
		}
		ch := t.idle
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
