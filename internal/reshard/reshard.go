// Package reshard executes package shard's start-up and resharding
// protocol (shard.Next) against Postgres: it observes the state table's
// row, the slots and the publications, performs the Action Next asks for,
// and observes again, until Next says Stream. One instance runs the loop
// at a time, under a session advisory lock keyed by the slot name.
//
// The loop (Run) works on a DB, so that it is tested against a fake; PG is
// the DB on a Postgres connection.
package reshard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxd/outboxd/internal/pause"

	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/wal"
)

// Observed is what DB.Observe reads: the state table's row (nil: none),
// the logical slots of the database and the publications.
type Observed struct {
	Plan         *shard.Plan
	Slots        []shard.Slot
	Publications []string
}

// DB is what Run needs of Postgres. Every write is idempotent: a create of
// something that exists and a drop of something absent succeed. The
// conditional writes report whether the row still held the observed plan.
type DB interface {
	Observe(ctx context.Context) (Observed, error)
	// Begin creates the state table if needed and inserts p unless a row
	// for the slot exists.
	Begin(ctx context.Context, p shard.Plan) error
	// CreatePublications creates the new shards' publications named that
	// do not exist and checks every one that does (each outbox table
	// listed with its shard filter). fix says that a new shard's slot is
	// made after it: an existing publication may then be put right, and
	// is refused otherwise (a *PermanentError).
	CreatePublications(ctx context.Context, names []string, fix bool) error
	CreateSlots(ctx context.Context, names []string) error
	// CutoverLSN waits until every transaction open when it is called
	// has ended, then reads the WAL insert position.
	CutoverLSN(ctx context.Context) (wal.LSN, error)
	// SetPhase moves the row from the observed plan to phase (with cutover
	// when not zero).
	SetPhase(ctx context.Context, observed shard.Plan, phase shard.Phase, cutover wal.LSN) (bool, error)
	// DropSlots drops the slots, terminating any backend that holds one.
	DropSlots(ctx context.Context, names []string) error
	DropPublications(ctx context.Context, names []string) error
	Advance(ctx context.Context, names []string, to wal.LSN) error
	// Delete deletes the row if it still holds the observed plan.
	Delete(ctx context.Context, observed shard.Plan) (bool, error)
}

// Drain runs the old shards' pipelines with window w until each has
// delivered its window (Window.Done), or ctx ends.
type Drain func(ctx context.Context, shards []shard.Shard, w shard.Window) error

// Delivered reads, in exactly-once mode, the position each old shard's
// transactional id committed in Kafka, by slot (shard.View.Delivered),
// having fenced those ids. Run calls it right before it records the
// cutover, with every slot idle.
type Delivered func(ctx context.Context, old []shard.Shard) (map[string]wal.LSN, error)

// Config is the layout Run drives towards.
type Config struct {
	Slot, Publication string // the configured (base) names
	Want              int    // postgres.shards
	Poll              time.Duration
	// Progress, if set, is told each step, for the relay's status.
	Progress func(string)
	// Delivered, if set (exactly-once mode), is read before the cutover
	// is recorded, and the cutover is taken at or past what it returns.
	Delivered Delivered
}

// Run drives db to cfg.Want shards with shard.Next and returns the shards
// to stream, with the window to run them with: Window{After: X} when this
// run finished a reshard with cutover X, having advanced the new slots to
// it. The advance reaches the slot's state
// file only at Postgres' next checkpoint (DB.Advance asks for one, which
// needs a privilege the role may lack), and a Postgres crash before it
// puts a new slot back where it was created, before X: the window keeps
// the new shards from delivering again what the old ones delivered. drain
// runs the old shards while a reshard drains. It returns ctx's error when
// ctx ends first, and Next's error for a state no step can repair.
func Run(ctx context.Context, db DB, cfg Config, drain Drain, log *slog.Logger) ([]shard.Shard, shard.Window, error) {
	var w shard.Window
	progress := func(format string, args ...any) {
		if cfg.Progress != nil {
			cfg.Progress(fmt.Sprintf(format, args...))
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, w, err
		}
		o, err := db.Observe(ctx)
		if err != nil {
			return nil, w, err
		}
		v := shard.View{Slot: cfg.Slot, Publication: cfg.Publication, Want: cfg.Want,
			Plan: o.Plan, Slots: o.Slots, Publications: o.Publications}
		a, err := shard.Next(v)
		if err == nil && a.Kind == shard.Cutover && cfg.Delivered != nil {
			// A killed exactly-once instance may have committed Kafka
			// transactions past its slot's confirmed position: the
			// cutover must not let the new shards deliver those again.
			progress("resharding from %d to %d shards: reading the old shards' positions in Kafka", a.Plan.From, a.Plan.To)
			if v.Delivered, err = cfg.Delivered(ctx, a.Shards); err == nil {
				a, err = shard.Next(v)
			} else if ctx.Err() == nil {
				var perm *PermanentError
				if errors.As(err, &perm) {
					return nil, w, err
				}
				log.Warn("reading the old shards' positions in Kafka failed; observing again", "err", err)
				if !pause.For(ctx, cfg.Poll) {
					return nil, w, ctx.Err()
				}
				continue
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, w, ctx.Err()
			}
			return nil, w, err
		}
		if a.Kind != shard.Stream && a.Kind != shard.Wait {
			log.Info("resharding", "step", a.Kind.String(), "from", a.Plan.From, "to", a.Plan.To,
				"slots", a.Slots, "publications", a.Publications, "cutover", a.Cutover.String())
		}
		moved := true
		switch a.Kind {
		case shard.Stream:
			return a.Shards, w, nil
		case shard.Begin:
			progress("resharding from %d to %d shards: recording the reshard", a.Plan.From, a.Plan.To)
			err = db.Begin(ctx, a.Plan)
		case shard.Create:
			progress("resharding from %d to %d shards: creating the new shards' publications and slots", a.Plan.From, a.Plan.To)
			// Every publication of the new layout, the existing ones too:
			// a table one lacks would lose its rows after the cutover.
			// A slot is made after this, and the cutover is taken at or
			// past its start, so a publication put right here is right
			// for every row the new shards deliver.
			if err = checkPublications(ctx, db, cfg, a.Plan, len(a.Slots) > 0); err == nil {
				err = db.CreateSlots(ctx, a.Slots)
			}
		case shard.Cutover:
			progress("resharding from %d to %d shards: recording the cutover", a.Plan.From, a.Plan.To)
			// Checked again (a publication changed, or a table added to
			// postgres.tables, since the slots were made), refusing only.
			// The cutover is taken past the commit of every transaction
			// open at the check's passing: the old shards deliver every
			// row up to it, so a publication put right by hand after the
			// slots were made is right for every row the new shards
			// deliver, a transaction open across the fix included
			// (second review of issue 35 §1, S1; third, M1).
			if err = checkPublications(ctx, db, cfg, a.Plan, false); err == nil {
				progress("resharding from %d to %d shards: recording the cutover: waiting for the transactions open now to end", a.Plan.From, a.Plan.To)
				var now wal.LSN
				if now, err = db.CutoverLSN(ctx); err == nil {
					// Checked once more after the wait, which lasts as
					// long as the oldest transaction: a publication
					// changed during it is refused as before it
					// (fourth review of issue 35 §1, S3).
					err = checkPublications(ctx, db, cfg, a.Plan, false)
				}
				if err == nil {
					moved, err = db.SetPhase(ctx, a.Plan, shard.Draining, max(a.Cutover, now))
				}
			}
		case shard.Drain:
			progress("resharding from %d to %d shards: the old shards deliver up to the cutover at %s", a.Plan.From, a.Plan.To, a.Window.Upto)
			err = drain(ctx, a.Shards, a.Window)
		case shard.Switch:
			moved, err = db.SetPhase(ctx, a.Plan, shard.Switched, 0)
		case shard.DropOld:
			progress("resharding from %d to %d shards: dropping the old shards", a.Plan.From, a.Plan.To)
			if err = db.DropSlots(ctx, a.Slots); err == nil {
				err = db.DropPublications(ctx, a.Publications)
			}
		case shard.Advance:
			w = shard.Window{After: a.Cutover}
			err = db.Advance(ctx, a.Slots, a.Cutover)
		case shard.Finish:
			w = shard.Window{After: a.Plan.Cutover}
			moved, err = db.Delete(ctx, a.Plan)
			if err == nil && moved {
				log.Info("resharded", "from", a.Plan.From, "to", a.Plan.To, "cutover", a.Plan.Cutover.String())
			}
		case shard.Rollback:
			progress("rolling back the reshard from %d to %d shards", a.Plan.From, a.Plan.To)
			if a.Plan.Phase != shard.RollingBack {
				moved, err = db.SetPhase(ctx, a.Plan, shard.RollingBack, 0)
				if err != nil || !moved {
					break
				}
				a.Plan.Phase = shard.RollingBack
			}
			if err = db.DropSlots(ctx, a.Slots); err == nil {
				err = db.DropPublications(ctx, a.Publications)
			}
			if err == nil {
				moved, err = db.Delete(ctx, a.Plan)
			}
		case shard.Wait:
			progress("resharding: waiting: %s", a.Reason)
			log.Info("resharding: waiting", "reason", a.Reason)
			moved = false
		default:
			return nil, w, fmt.Errorf("reshard: unknown action %v", a.Kind)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, w, ctx.Err()
			}
			var perm *PermanentError
			if errors.As(err, &perm) {
				return nil, w, err
			}
			log.Warn("resharding step failed; observing again", "step", a.Kind.String(), "err", err)
			moved = false
		}
		if !moved && !pause.For(ctx, cfg.Poll) {
			return nil, w, ctx.Err()
		}
	}
}

// checkPublications runs db.CreatePublications on every publication of the
// new layout of p while the reshard is creating, and says what a refusal
// means for the reshard.
func checkPublications(ctx context.Context, db DB, cfg Config, p shard.Plan, fix bool) error {
	names, err := shard.Names(cfg.Publication, p.To)
	if err != nil {
		return &PermanentError{fmt.Errorf("postgres.publication: %w", err)}
	}
	err = db.CreatePublications(ctx, names, fix)
	var perm *PermanentError
	switch {
	case !errors.As(err, &perm):
		return err
	case fix:
		return &PermanentError{fmt.Errorf("checking the publications of the %d new shards before the cutover: %w. The reshard from %d to %d shards is still creating: "+
			"the old shards' slots hold every event their publications list, and the new shards' slots are made once their publications are right, so the reshard itself loses no event "+
			"(rows the refusal above says reached no shard were never published: send them as it says)", p.To, err, p.From, p.To)}
	}
	return &PermanentError{fmt.Errorf("checking the publications of the %d new shards before the cutover: %w. No cutover is recorded yet, and it is taken past the end of every transaction open when this check passes (the old shards deliver every row their publications list up to it), so the reshard itself loses no event: "+
		"run what is named with outboxd stopped and start outboxd again, and send the rows the refusal above says reached no shard as it says; or set postgres.shards: %d to roll the reshard back (it drops the new shards' slots), then set postgres.shards: %d again", p.To, err, p.From, p.To)}
}

// PermanentError is a step's failure that observing again cannot fix (a
// setting forbids the step, or Postgres refuses it for good).
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }
