package delivery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/internal/eos"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// This file is kafka.delivery: exactly_once's driver (DESIGN.md,
// "Exactly-once mode"): the I/O around package eos, which decides. The
// pipeline goroutine feeds an eos.Machine the stream and carries out its
// steps on the transactional producer and the tracker: each Postgres
// transaction holds one extra record in the tracker (a hold) from its Begin
// until the Kafka transaction holding its last record commits, so the ack
// rule confirms the slot only to committed positions.

// Transactions is what exactly-once's pipeline uses of a *sink.Producer.
type Transactions interface {
	Begin() error
	Commit(ctx context.Context, position []byte) error
	Abort(ctx context.Context) error
	InTransaction() bool
	AsFenced(err error) error
	Fenced(ctx context.Context) (bool, error)
	TransactionalID() string
}

// ExactlyOnce is one pipeline run's exactly-once driver, used by the
// pipeline goroutine only: it feeds machine and carries out its steps.
type ExactlyOnce struct {
	Machine  *eos.Machine
	producer Transactions
	tracker  *checkpoint.Tracker
	fail     context.CancelCauseFunc
	// completed are the Postgres transactions whose last record is in the
	// open Kafka transaction, in commit order: their holds are released
	// when it commits.
	completed []*checkpoint.Txn
}

// NewExactlyOnce returns the driver of a run whose machine decides, on
// producer and tracker; fail ends the run with its cause.
func NewExactlyOnce(machine *eos.Machine, producer Transactions, tracker *checkpoint.Tracker, fail context.CancelCauseFunc) *ExactlyOnce {
	return &ExactlyOnce{Machine: machine, producer: producer, tracker: tracker, fail: fail}
}

// Skipping reports whether the transaction being received is in Kafka
// already, whole: Handle gives its items to skip.
func (x *ExactlyOnce) Skipping() bool { return x.Machine.Skipping() }

// Skip handles an item of a transaction skipped whole.
func (x *ExactlyOnce) Skip(item wal.Item) error {
	if c, ok := item.(*wal.Commit); ok {
		x.Machine.Commit(c.EndLSN) // the end of the skipping
	}
	return nil
}

// Begin starts a Postgres transaction. It reports whether to skip it whole
// (it ends at or before the position), and commits the open Kafka
// transaction first when the tracker's queue is full: only that commit
// makes room.
func (x *ExactlyOnce) Begin(ctx context.Context, m *wal.Begin) (skip bool, err error) {
	step := x.Machine.Begin(m.FinalLSN, x.tracker.Pending())
	return step.Skip, x.Apply(ctx, step)
}

// Hold keeps t unconfirmed until the Kafka transaction holding its last
// record commits.
func (x *ExactlyOnce) Hold(t *checkpoint.Txn) { t.Add() }

// Row is called for each row before it is delivered. It reports whether
// to skip it (a previous run put it in Kafka), and opens, or splits, a
// Kafka transaction as the machine says.
func (x *ExactlyOnce) Row(ctx context.Context, rec *router.Record) (skip bool, err error) {
	size := 0
	if rec != nil {
		size = rec.Size()
	}
	step := x.Machine.Row(time.Now(), size)
	return step.Skip, x.Apply(ctx, step)
}

// Committed ends the Postgres transaction t (committed to the tracker);
// RunExactlyOnce then asks Boundary whether to commit the Kafka transaction.
func (x *ExactlyOnce) Committed(ctx context.Context, t *checkpoint.Txn, end wal.LSN) error {
	x.completed = append(x.completed, t)
	return x.Apply(ctx, x.Machine.Commit(end))
}

// Boundary is a Postgres transaction boundary; waiting tells whether a
// complete Postgres transaction may be waiting behind it.
func (x *ExactlyOnce) Boundary(ctx context.Context, waiting bool) error {
	return x.Apply(ctx, x.Machine.Boundary(time.Now(), waiting))
}

// Finish commits what the run completed when the stream has ended at a
// transaction boundary.
func (x *ExactlyOnce) Finish(ctx context.Context) error {
	if ctx.Err() != nil {
		return nil // end aborts
	}
	return x.Apply(ctx, x.Machine.Finish())
}

// Apply carries out a step of the machine (but Skip, the caller's): commit
// the open Kafka transaction with the position, release the holds of the
// Postgres Transactions it completed, open a Kafka transaction.
func (x *ExactlyOnce) Apply(ctx context.Context, step eos.Step) error {
	if step.Commit {
		if err := x.producer.Commit(ctx, step.Position.Encode(time.Now())); err != nil {
			return err
		}
	}
	if n := step.Release; n > 0 {
		for _, t := range x.completed[:n] {
			t.Ack()
		}
		x.completed = slices.Delete(x.completed, 0, n)
	}
	if step.Open {
		return x.producer.Begin()
	}
	return nil
}

// End aborts a Kafka transaction the run leaves open (Kafka would abort it
// only at its timeout, holding read_committed consumers back until then),
// and tells a run that ended because another instance took over.
func (x *ExactlyOnce) End(ctx context.Context, err error) error {
	if err == nil && ctx.Err() == nil && !x.producer.InTransaction() {
		return nil
	}
	abortCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err = x.producer.AsFenced(err)
	var fenced *sink.FencedError
	if !errors.As(err, &fenced) {
		// The run may be ending for another reason first (the stream lost
		// the slot's connection): ask Kafka whether it was fenced.
		askCtx, cancel := context.WithTimeout(abortCtx, 2*time.Second)
		if newer, askErr := x.producer.Fenced(askCtx); askErr == nil && newer {
			fenced = &sink.FencedError{TransactionalID: x.producer.TransactionalID(),
				Err: errors.New("the transaction coordinator holds a newer producer epoch")}
			err = fenced
		}
		cancel()
	}
	// Name the run's cause before aborting: the records the abort fails
	// must not become it.
	cause := err
	if cause == nil {
		cause = context.Cause(ctx) // the error that ended the run's errgroup
	}
	if cause != nil {
		x.fail(cause)
	}
	abortErr := x.producer.Abort(abortCtx)
	if fenced == nil && errors.As(abortErr, &fenced) {
		return fenced // too late to be the run's cause, but the pipeline's error
	}
	if abortErr != nil && err == nil && ctx.Err() == nil {
		return abortErr
	}
	return err
}

// newExactlyOnce returns the driver of p's run, resuming from resume.
func (p *Pipeline) newExactlyOnce(producer Transactions, system string, timeline int, resume eos.Position) *ExactlyOnce {
	return NewExactlyOnce(eos.New(eos.LimitsOf(p.cfg.Kafka), p.cfg.Postgres.Slot, system, timeline, resume, p.tracker.Confirmed()), producer, p.tracker, p.fail)
}

// startExactlyOnce initialises the transactional producer (fencing the
// previous holder of the id, whose open transaction Kafka aborts), reads
// the last committed position, applies it to the run's server (as the
// connect stage read it) and confirms it. Before it fences anyone it looks
// at the id's last position, committed or not: when another deployment's
// id it is, it refuses without disturbing that deployment; when it cannot
// read it, the run fails before Init and the next one tries again. It
// opens no connection to Postgres.
func (p *Pipeline) startExactlyOnce(ctx context.Context, producer *sink.Producer, server Server) (*ExactlyOnce, error) {
	owner := PositionOwner(p.cfg, producer.TransactionalID(), server.System)
	if err := Fence(ctx, producer, owner); err != nil {
		return nil, err
	}
	read, found, err := ReadPosition(ctx, producer.ReadPosition, owner)
	if err != nil {
		return nil, err
	}
	resumed, err := eos.Resume(read, server.Server, p.cfg.Kafka.PositionsTopic)
	if err != nil {
		return nil, err
	}
	WarnResumed(p.log, p.cfg.Postgres.Slot, read, resumed)
	pos := resumed.Position
	p.txnM.SetPositionRead(uint64(pos.LSN))
	p.tracker.Idle(pos.LSN) // nothing is registered yet: confirms it when it is past the slot
	p.log.Info("exactly-once: resuming after the position committed in Kafka", "transactional_id", producer.TransactionalID(),
		"lsn", pos.LSN.String(), "split_txn", pos.Txn.String(), "split_rows", pos.Rows, "found", found, "slot", p.cfg.Postgres.Slot)
	return p.newExactlyOnce(producer, server.System, p.timeline, pos), nil
}

// RunExactlyOnce is Run in exactly-once mode, on the transactional
// producer the pipeline was built with and the run's server as the connect
// stage read it (ReadServer): it starts exactly-once (startExactlyOnce),
// and besides the batches it wakes up to commit a Kafka transaction that is
// due while nothing arrives.
func (p *Pipeline) RunExactlyOnce(ctx context.Context, batches <-chan []wal.Item, server Server) (err error) {
	// The records and the transaction's commit or abort go through one
	// producer: the one the pipeline was built with.
	producer, ok := p.producer.(*sink.Producer)
	if !ok {
		return fmt.Errorf("delivery: exactly-once needs the pipeline built with a transactional *sink.Producer, not %T", p.producer)
	}
	x, err := p.startExactlyOnce(ctx, producer, server)
	if err != nil {
		return err
	}
	p.eos = x
	defer func() { err = x.End(ctx, err) }()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var wake <-chan time.Time
		if at, ok := x.Machine.Due(); ok {
			timer.Reset(time.Until(at))
			wake = timer.C
		}
		select {
		case batch, ok := <-batches:
			if !ok {
				return x.Finish(ctx)
			}
			last := LastCommit(batch)
			for i, item := range batch {
				if _, ok := item.(*wal.Begin); ok {
					// A boundary too: the one after the last Commit may
					// have counted this transaction as complete and waiting
					// when only its Begin and first rows were queued.
					if err := x.Boundary(ctx, i < last || len(batches) > 0); err != nil {
						return err
					}
				}
				if err := p.Handle(item); err != nil {
					return err
				}
				if _, ok := item.(*wal.Commit); ok {
					// A complete transaction waits behind this one if a
					// later Commit is in the batch, or may if another
					// batch is queued.
					if err := x.Boundary(ctx, i < last || len(batches) > 0); err != nil {
						return err
					}
				}
			}
			if err := x.Boundary(ctx, len(batches) > 0); err != nil {
				return err
			}
		case <-wake:
			if err := x.Apply(ctx, x.Machine.Tick(time.Now())); err != nil {
				return err
			}
		}
	}
}
