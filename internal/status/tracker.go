package status

import (
	"fmt"
	"sync"
	"time"
)

// StuckAfter: with records in flight and the confirmed position unchanged
// this long, the relay is not ready.
const StuckAfter = 30 * time.Second

// Tracker is one relay's self-report, updated by its supervisor and runs
// and read by Status; it is safe for concurrent use. Positions are LSNs in
// their text form (wal.LSN.String).
type Tracker struct {
	mu            sync.Mutex
	s             Status
	lastConfirmed string
	advancedAt    time.Time
}

// SetState records the relay's state and why.
func (st *Tracker) SetState(state State, reason string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.s.State != state {
		st.s.Since = time.Now()
	}
	st.s.State, st.s.Reason = state, reason
	if state == Streaming {
		return
	}
	// Out of streaming, nothing of this process is in flight.
	st.s.InFlight, st.s.ReceivedLSN = 0, ""
	st.advancedAt = time.Time{}
	if state == Standby { // the slot and its positions are another process's
		st.s.ConfirmedLSN, st.s.SentLSN, st.s.ConfirmedCommitTime = "", "", time.Time{}
		st.lastConfirmed = ""
	}
}

// SetApplied records the slot's confirmed position as Postgres shows it,
// unless the slot is another process's.
func (st *Tracker) SetApplied(lsn string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.s.State == Streaming || st.s.State == Starting {
		st.s.ConfirmedLSN = lsn
	}
}

// SetError records the last error.
func (st *Tracker) SetError(err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.s.LastError, st.s.LastErrorTime = err.Error(), time.Now()
}

// SetPosition records a run's status update: the position it confirmed,
// the end of what it received, the commit time of the last transaction it
// confirmed, and its records in flight.
func (st *Tracker) SetPosition(confirmed, received string, commitTime time.Time, inFlight int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	now := time.Now()
	if confirmed != st.lastConfirmed || inFlight == 0 || st.advancedAt.IsZero() {
		st.lastConfirmed, st.advancedAt = confirmed, now
	}
	st.s.SentLSN, st.s.ReceivedLSN, st.s.InFlight = confirmed, received, inFlight
	if !commitTime.IsZero() {
		st.s.ConfirmedCommitTime = commitTime
	}
}

// Status reports the relay's state and positions, for its slot; a
// streaming relay whose confirmed position has not advanced for StuckAfter
// with records in flight says why it is not ready.
func (st *Tracker) Status(slot string) Status {
	st.mu.Lock()
	defer st.mu.Unlock()
	s := st.s
	s.Slot = slot
	if s.State == Streaming && s.InFlight > 0 && time.Since(st.advancedAt) > StuckAfter {
		s.Reason = fmt.Sprintf("the confirmed position has not advanced for %s with %d records in flight; Kafka is slow or unreachable",
			time.Since(st.advancedAt).Round(time.Second), s.InFlight)
	}
	return s
}
