package relay

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/internal/preflight"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// Errors classify themselves, the way pgconn's SafeToRetry does: each
// error type answers through one of these small interfaces, so that a new
// error type needs no central switch. A false answer is no answer: an error
// is permanent (or says the slot is gone) when any error it wraps says so.
//
//   - Permanent() bool: a pipeline restart cannot fix it (a rejected
//     record, a poison row, an undecodable message, a missing slot or
//     publication): Run returns it instead of restarting.
//   - SlotGone() bool: the slot is missing or invalidated: the command
//     exits with status.ExitSlotGone.
//   - Hint() string: what to do, apart from what is wrong (Error()), which
//     the command prints on a line of its own.
//
// A server's error is judged by its SQLSTATE (permanentCode) and, for a
// slot or publication that may be gone, by a fresh read of the catalogue
// (preflight.Checker.JudgeGone), never by its message, which is in the server's language.
type (
	permanent interface{ Permanent() bool }
	slotGone  interface{ SlotGone() bool }
)

// IsPermanent reports whether err is one that a pipeline restart cannot fix:
// Run returns it instead of restarting.
func IsPermanent(err error) bool {
	return anyWrapped(err, func(e error) bool {
		switch e := e.(type) {
		case permanent:
			return e.Permanent()
		case *pgconn.PgError:
			return permanentCode(e.Code)
		}
		return false
	})
}

// permanentCode reports a SQLSTATE that a restart cannot fix. A gone slot
// or publication (42704, 55000) is not decided here: explain reads the
// catalogue (preflight.Checker.JudgeGone).
func permanentCode(code string) bool {
	switch code {
	case "28000", "28P01", // authentication
		"42501": // insufficient_privilege
		return true
	}
	return false
}

// SlotGone reports an error saying that the slot is missing or invalidated,
// as the error itself tells (wal.ErrSlotMissing and wal.ErrSlotLost). A
// server's error is never taken for one by its code alone: explain reads
// pg_replication_slots afresh and turns it into outboxd's own, or leaves it
// to be retried (the next run's slot inspection decides).
func SlotGone(err error) bool {
	return anyWrapped(err, func(e error) bool {
		g, ok := e.(slotGone)
		return ok && g.SlotGone()
	})
}

// Hint returns what to do about err: the hint of the outermost error in its
// chain that has one (a Hint() string method), "" when none has.
func Hint(err error) string {
	var h string
	anyWrapped(err, func(e error) bool {
		if e, ok := e.(interface{ Hint() string }); ok {
			h = e.Hint()
		}
		return h != ""
	})
	return h
}

// anyWrapped reports whether is holds for err or any error it wraps, through
// Unwrap() error and Unwrap() []error (fmt.Errorf with several %w,
// errors.Join).
func anyWrapped(err error, is func(error) bool) bool {
	for err != nil {
		if is(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if anyWrapped(e, is) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// explain turns server errors whose meaning for the events is not obvious
// into ones that say it and what to do. It decides by SQLSTATE and, for a
// slot or publication that may be gone, by a fresh read of the catalogue
// (preflight.Checker.JudgeGone, with the slot's history) on the server at
// addr (the run's; any host of postgres.dsn when ""), never by the server's
// message text.
func (r *Relay) explain(ctx context.Context, err error, addr string, history *preflight.History) error {
	if r.cfg.Kafka.ExactlyOnce() {
		err = sink.AsFenced(r.txnID, err) // a record refused as fenced
	}
	var pgErr *pgconn.PgError
	switch {
	case !errors.As(err, &pgErr):
		return err
	case wal.PublicationSkipped(pgErr):
		return r.check.PublicationDropped(pgErr)
	}
	return r.check.JudgeGone(ctx, pgErr, err, addr, history)
}
