package eos

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/wal"
)

// Position is what exactly-once mode writes to kafka.positions_topic with
// each Kafka transaction it commits, keyed by the transactional id.
type Position struct {
	// LSN is the end LSN of the last Postgres transaction whose rows are
	// all in Kafka; a restart skips every transaction ending at or before it.
	LSN wal.LSN
	// Txn, if not 0, is the commit LSN of a Postgres transaction split over
	// Kafka transactions (the split marker), and Rows how many of its rows
	// are in Kafka.
	Txn  wal.LSN
	Rows int
	// Timeline is the server's timeline when the position was written (0:
	// not known). After a promotion the new timeline may have begun before
	// LSN, and its transactions between the two would be skipped.
	Timeline int
	// Slot and System name the slot and the database (its IDENTIFY_SYSTEM
	// identifier; "" in positions written before it was recorded: not
	// known) whose stream the position is in. Its LSNs mean nothing in
	// another's.
	Slot, System string
	// Backfill, if not "", is the cursor of the slot's backfill
	// (postgres.backfill; package backfill writes and reads it, a JSON
	// object this package does not look into): a Kafka transaction of the
	// backfill writes it with LSN 0, which is no stream position: the
	// stream then starts from the slot's confirmed position, as with no
	// position at all. The stream's own positions carry none.
	Backfill string
}

type positionJSON struct {
	LSN      string          `json:"lsn"`
	Txn      string          `json:"txn,omitempty"`
	Rows     int             `json:"rows,omitempty"`
	Timeline int             `json:"timeline,omitempty"`
	Slot     string          `json:"slot"`
	System   string          `json:"system,omitempty"`
	Backfill json.RawMessage `json:"backfill,omitempty"`
	At       string          `json:"at"`
}

// Encode returns the position as it is written to Kafka, stamped with at
// (for people reading the topic; nothing decides by it).
func (p Position) Encode(at time.Time) []byte {
	j := positionJSON{LSN: p.LSN.String(), Rows: p.Rows, Timeline: p.Timeline, Slot: p.Slot, System: p.System,
		At: at.UTC().Format(time.RFC3339Nano)}
	if p.Txn != 0 {
		j.Txn = p.Txn.String()
	}
	if p.Backfill != "" {
		j.Backfill = json.RawMessage(p.Backfill)
	}
	b, _ := json.Marshal(j)
	return b
}

// DecodePosition parses a position Encode wrote.
func DecodePosition(b []byte) (Position, error) {
	var j positionJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return Position{}, err
	}
	p := Position{Timeline: j.Timeline, Slot: j.Slot, System: j.System, Backfill: string(j.Backfill)}
	var err error
	if p.LSN, err = pglogrepl.ParseLSN(j.LSN); err != nil {
		return Position{}, err
	}
	if j.Txn != "" {
		if p.Txn, err = pglogrepl.ParseLSN(j.Txn); err != nil {
			return Position{}, err
		}
		p.Rows = j.Rows
	}
	return p, nil
}

// Owner names whose positions a run applies: the run's slot and the system
// identifier of its database, and, for messages, the transactional id and
// kafka.positions_topic the position is read under.
type Owner struct {
	Slot, System string
	ID, Topic    string
}

// Read judges value, the last record of the owner's transactional id in
// the positions topic. found is false when there is none (an empty value is
// a tombstone, an operator's: no position either). A value that is not
// outboxd's is a *ForeignError, and a position written for another slot or
// database a *RefusedError (Own).
func Read(value []byte, owner Owner) (pos Position, found bool, err error) {
	if len(value) == 0 {
		return Position{}, false, nil
	}
	if pos, err = DecodePosition(value); err != nil {
		return Position{}, false, &ForeignError{fmt.Errorf("the position of %q in %s is not outboxd's (%q): %w; delete it, or set another kafka.transactional_id",
			owner.ID, owner.Topic, value, err)}
	}
	return pos, true, Own(pos, owner)
}

// Own refuses a position found under the owner's transactional id that was
// written for another slot than the owner's, or another database: two
// deployments given the same kafka.transactional_id. Its LSN says nothing
// about this slot's stream; applying it would skip this slot's transactions
// up to it and confirm the slot there. Each shard has its own slot and id
// (a reshard changes both), so a shard's position names its own slot. A
// position without a system identifier (an older outboxd's) is judged by
// its slot.
func Own(pos Position, owner Owner) error {
	var other string
	switch {
	case pos.Slot != owner.Slot:
		other = fmt.Sprintf("slot %q", pos.Slot)
		if pos.System != "" && pos.System != owner.System {
			other += fmt.Sprintf(" of the database with system identifier %s", pos.System)
		}
	case pos.System != "" && pos.System != owner.System:
		other = fmt.Sprintf("slot %q of the database with system identifier %s (this one's is %s)", pos.Slot, pos.System, owner.System)
	default:
		return nil
	}
	return &RefusedError{fmt.Errorf("the position of transactional id %q in %s (LSN %s) was written for %s, and this outboxd streams slot %q: "+
		"another deployment uses the same kafka.transactional_id, and applying its position would skip this slot's events. "+
		"Give each deployment its own kafka.transactional_id (or leave it empty: the default, outboxd-<system identifier>-<slot>, "+
		"differs per slot and database). If this deployment's slot or database was replaced, and the old one's events were all delivered, "+
		"write a tombstone for key %[1]q to %[2]s instead", owner.ID, owner.Topic, pos.LSN, other, owner.Slot)}
}

// RefusedError is a position that a restart cannot make applicable: the
// caller stops rather than try again (and, before it initialises the
// producer, fence the other holder of the transactional id again).
type RefusedError struct{ err error }

func (e *RefusedError) Error() string { return e.err.Error() }
func (e *RefusedError) Unwrap() error { return e.err }

// Permanent reports that a restart cannot fix it.
func (e *RefusedError) Permanent() bool { return true }

// ForeignError reports a record in the positions topic that is not
// outboxd's (another writer's, under the same transactional id).
type ForeignError struct{ err error }

func (e *ForeignError) Error() string { return e.err.Error() }
func (e *ForeignError) Unwrap() error { return e.err }
