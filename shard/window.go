package shard

import "github.com/jackc/pglogrepl"

// Window is the part of a slot's stream a shard delivers, by the end LSN of
// each transaction (its commit end, the position outboxd confirms): those
// ending after After and, when Upto is not zero, at or before Upto. The zero
// Window delivers everything. While resharding with cutover X, the old
// shards run with Window{Upto: X} and the new ones with Window{After: X}, so
// each transaction is delivered by the old shards or by the new, never both,
// and never neither.
type Window struct {
	After pglogrepl.LSN
	Upto  pglogrepl.LSN // 0: no end
}

// Delivers reports whether the transaction ending at end is the shard's to
// deliver. A transaction it does not deliver is skipped whole; the pipeline
// still counts it as done, since the other side of the cutover delivers it.
func (w Window) Delivers(end pglogrepl.LSN) bool {
	return end > w.After && (w.Upto == 0 || end <= w.Upto)
}

// Past reports whether the transaction ending at end lies beyond Upto: an
// old shard that meets one has nothing more to deliver and stops reading.
func (w Window) Past(end pglogrepl.LSN) bool { return w.Upto != 0 && end > w.Upto }

// Confirm returns the position to confirm to Postgres instead of pos (which
// the ack rule allows): pos, but never beyond Upto, so that a restarted old
// shard resumes at or before the cutover and its slot shows exactly Upto
// once it is done.
func (w Window) Confirm(pos pglogrepl.LSN) pglogrepl.LSN {
	if w.Upto != 0 && pos > w.Upto {
		return w.Upto
	}
	return pos
}

// Done reports whether a shard whose slot has confirmed confirmed has
// delivered everything its window holds. A window without Upto is never done.
func (w Window) Done(confirmed pglogrepl.LSN) bool { return w.Upto != 0 && confirmed >= w.Upto }
