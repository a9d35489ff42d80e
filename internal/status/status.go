// Package status holds what a running outboxd reports about itself: the
// State and Status that /readyz and /status serve, that `outboxd status`
// reads back, and the exit status a supervisor must not restart on.
//
// It is a leaf: the relay fills a Status (through a Tracker, which keeps
// it as the relay's supervisor and runs update it), the HTTP server
// (package httpserver) encodes it, and the admin commands (package admin)
// decode it, without any of them importing another.
package status

import "time"

// State is the relay's state, as /readyz, /status and outboxd_relay_state
// report it.
type State string

// The relay's states.
const (
	Starting  State = "starting"  // checking, or restarting after a failure
	Streaming State = "streaming" // a pipeline holds the slot
	Standby   State = "standby"   // another process holds the slot
	Stopped   State = "stopped"   // Run returned
)

// Status is what a running outboxd reports about itself.
type Status struct {
	State  State     `json:"state"`
	Since  time.Time `json:"since"`
	Reason string    `json:"reason,omitempty"` // why not ready, when not
	Slot   string    `json:"slot"`
	// ConfirmedLSN is the slot's confirmed position as Postgres applied it
	// (its confirmed_flush_lsn in pg_replication_slots, read when the
	// stream starts and every postgres.slot_lag_interval); SentLSN is the
	// position outboxd last sent in a status update, which Postgres applies
	// a moment later. ConfirmedCommitTime is the commit time of the last
	// transaction this process confirmed. A standby shows none of them: the
	// slot is another process's.
	ConfirmedLSN        string    `json:"confirmed_lsn,omitempty"`
	SentLSN             string    `json:"sent_lsn,omitempty"`
	ConfirmedCommitTime time.Time `json:"confirmed_commit_time,omitzero"`
	ReceivedLSN         string    `json:"received_lsn,omitempty"`
	InFlight            int       `json:"in_flight"`
	LastError           string    `json:"last_error,omitempty"`
	LastErrorTime       time.Time `json:"last_error_time,omitzero"`
	Version             string    `json:"version,omitempty"`
	// Shards, with postgres.shards > 1 or while resharding, is each
	// shard's own Status (its Slot names it); the fields above are then
	// their summary: the worst state, the first reason, the latest error,
	// the records in flight of all.
	Shards []Status `json:"shards,omitempty"`
}

// ExitSlotGone is outboxd's exit status when the slot is missing or
// invalidated. A restart does not bring the slot back, and on timeline 1 a
// restarted outboxd would create a new slot at the current position, past
// every event the old one had not confirmed: service managers must not
// restart on it (deploy/systemd/outboxd.service, RestartPreventExitStatus).
const ExitSlotGone = 3
