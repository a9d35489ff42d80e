package relay

import (
	"fmt"
	"sync"
	"time"

	report "github.com/outboxd/outboxd/internal/status" // the relay's own status type is named status
	"github.com/outboxd/outboxd/wal"
)

// Status and State are what the relay reports about itself; they live in
// the leaf package status, which the HTTP server and the admin commands
// read without importing the relay.
type (
	Status = report.Status
	State  = report.State
)

// The relay's states.
const (
	StateStarting  = report.Starting
	StateStreaming = report.Streaming
	StateStandby   = report.Standby
	StateStopped   = report.Stopped
)

// stuckAfter: with records in flight and the confirmed position unchanged
// this long, the relay is not ready.
const stuckAfter = 30 * time.Second

// status is the relay's self-report, updated by the pipeline.
type status struct {
	mu            sync.Mutex
	s             Status
	lastConfirmed wal.LSN
	advancedAt    time.Time
}

func (st *status) setState(state State, reason string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.s.State != state {
		st.s.Since = time.Now()
	}
	st.s.State, st.s.Reason = state, reason
	if state == StateStreaming {
		return
	}
	// Out of streaming, nothing of this process is in flight.
	st.s.InFlight, st.s.ReceivedLSN = 0, ""
	st.advancedAt = time.Time{}
	if state == StateStandby { // the slot and its positions are another process's
		st.s.ConfirmedLSN, st.s.SentLSN, st.s.ConfirmedCommitTime = "", "", time.Time{}
		st.lastConfirmed = 0
	}
}

// setApplied records the slot's confirmed position as Postgres shows it,
// unless the slot is another process's.
func (st *status) setApplied(lsn wal.LSN) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.s.State == StateStreaming || st.s.State == StateStarting {
		st.s.ConfirmedLSN = lsn.String()
	}
}

func (st *status) setError(err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.s.LastError, st.s.LastErrorTime = err.Error(), time.Now()
}

func (st *status) setPosition(confirmed, received wal.LSN, commitTime time.Time, inFlight int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	now := time.Now()
	if confirmed != st.lastConfirmed || inFlight == 0 || st.advancedAt.IsZero() {
		st.lastConfirmed, st.advancedAt = confirmed, now
	}
	st.s.SentLSN, st.s.ReceivedLSN, st.s.InFlight = confirmed.String(), received.String(), inFlight
	if !commitTime.IsZero() {
		st.s.ConfirmedCommitTime = commitTime
	}
}

// Status reports the relay's state and positions.
func (r *Relay) Status() Status {
	st := &r.status
	st.mu.Lock()
	defer st.mu.Unlock()
	s := st.s
	s.Slot = r.cfg.Postgres.Slot
	if s.State == StateStreaming && s.InFlight > 0 && time.Since(st.advancedAt) > stuckAfter {
		s.Reason = fmt.Sprintf("the confirmed position has not advanced for %s with %d records in flight; Kafka is slow or unreachable",
			time.Since(st.advancedAt).Round(time.Second), s.InFlight)
	}
	return s
}

// Ready reports whether the relay is streaming and making progress.
func (r *Relay) Ready() (bool, Status) {
	s := r.Status()
	return s.State == StateStreaming && s.Reason == "", s
}

// SlotConfirmed records the slot's confirmed position as Postgres shows it
// (pg_replication_slots.confirmed_flush_lsn, read by package slotlag), for
// Status; a standby ignores it, the slot being another process's.
func (r *Relay) SlotConfirmed(lsn wal.LSN) { r.status.setApplied(lsn) }
