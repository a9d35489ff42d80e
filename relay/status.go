package relay

import (
	report "github.com/outboxd/outboxd/internal/status" // named report beside Relay.Status and Relay.status
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

// Status reports the relay's state and positions.
func (r *Relay) Status() Status { return r.status.Status(r.cfg.Postgres.Slot) }

// Ready reports whether the relay is streaming and making progress.
func (r *Relay) Ready() (bool, Status) {
	s := r.Status()
	return s.State == StateStreaming && s.Reason == "", s
}

// SlotConfirmed records the slot's confirmed position as Postgres shows it
// (pg_replication_slots.confirmed_flush_lsn, read by package slotlag), for
// Status; a standby ignores it, the slot being another process's.
func (r *Relay) SlotConfirmed(lsn wal.LSN) { r.status.SetApplied(lsn.String()) }
