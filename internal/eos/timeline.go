package eos

import (
	"fmt"

	"github.com/outboxd/outboxd/wal"
)

// Server is the run's server as IDENTIFY_SYSTEM shows it, read in the
// connect stage on the run's replication connection, before
// START_REPLICATION and before the producer is initialised (DESIGN.md).
type Server struct {
	Timeline int
	WALEnd   wal.LSN
	// End returns where timeline old ended on the way to Timeline (its
	// switch point in Timeline's history), and false when that history does
	// not pass through old. Resume calls it only for a position written on
	// an earlier timeline.
	End func(old int) (wal.LSN, bool, error)
}

// Resumed is a position as it applies to the server.
type Resumed struct {
	Position
	// Moved: the position lay past the switch point Switch, where the
	// server's timeline began, and was moved back to it. The events between
	// the two are in Kafka but were lost in the promotion.
	Moved bool
	// Dropped: the position's split marker named a transaction that
	// committed on the old timeline only, at or after Switch; a transaction
	// of this timeline is delivered whole.
	Dropped bool
	Switch  wal.LSN
}

// Resume returns pos, read under kafka.positions_topic topic, as it
// applies to server. A position written on an earlier timeline may lie
// past the point where the current one began (a promoted standby that had
// not received everything): the events between the two are in Kafka but
// not on this server, and the new timeline's transactions after the switch
// point must not be skipped as if they were those. Such a position is moved
// back to the switch point. A position from a later timeline than the
// server's (an old primary), or past the server's WAL (a database restored
// from a backup that kept its system identifier), is refused: applying it
// would skip what the server commits up to it.
func Resume(pos Position, server Server, topic string) (Resumed, error) {
	if pos.LSN == 0 {
		return Resumed{Position: pos}, nil // nothing to judge
	}
	history, err := checkTimeline(pos, server.Timeline, server.WALEnd, topic)
	if err != nil || !history {
		return Resumed{Position: pos}, err
	}
	end, ok, err := server.End(pos.Timeline)
	if err != nil {
		return Resumed{Position: pos}, err
	}
	if !ok {
		return Resumed{Position: pos}, fmt.Errorf("the position in %s was written on timeline %d, which is not in the history of this server's timeline %d; "+
			"it belongs to another server: delete it from %[1]s, or set another kafka.transactional_id", topic, pos.Timeline, server.Timeline)
	}
	on, moved, dropped := rewind(pos, end, server.Timeline)
	return Resumed{Position: on, Moved: moved, Dropped: dropped, Switch: end}, nil
}

// checkTimeline judges a position against the server's timeline tli and
// WAL end: refused (an error), to be checked against the timeline's
// history (history), or fine as it is.
func checkTimeline(pos Position, tli int, walEnd wal.LSN, topic string) (history bool, err error) {
	switch {
	case pos.Timeline > tli:
		return false, fmt.Errorf("the position in %s was written on timeline %d, and this server is on timeline %d: it is an old primary; "+
			"point postgres.dsn at the current primary (target_session_attrs=read-write)", topic, pos.Timeline, tli)
	case pos.Timeline != 0 && pos.Timeline < tli:
		return true, nil
	case pos.LSN > walEnd:
		return false, fmt.Errorf("the position in %s (LSN %s) is past this server's WAL (%s): the database was restored from a backup, "+
			"or the position is another server's, or another instance held the slot during this start (then the next run, which is retried, reads a later WAL end); "+
			"outboxd would skip what the server commits up to it. If it persists, set a new kafka.transactional_id (or delete the position's key from %[1]s) to start from the slot", topic, pos.LSN, walEnd)
	}
	return false, nil
}

// rewind returns pos, written on an earlier timeline, as it applies to
// timeline tli, which branched off at end: moved back to end when it lies
// past it (moved). A split marker applies only to a transaction whose
// commit record begins before end, the WAL both timelines share: a commit
// at or after end was on the old timeline only, and a transaction of the
// new one that commits at that LSN is another, none of whose rows are in
// Kafka. dropped tells that pos carried such a marker, now gone.
func rewind(pos Position, end wal.LSN, tli int) (on Position, moved, dropped bool) {
	dropped = pos.Txn != 0 && pos.Txn >= end
	if pos.LSN > end {
		return Position{LSN: end, Timeline: tli}, true, dropped
	}
	if dropped {
		pos.Txn, pos.Rows = 0, 0
	}
	return pos, false, dropped
}
