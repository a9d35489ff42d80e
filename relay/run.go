package relay

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/delivery"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/internal/preflight"
	"github.com/outboxd/outboxd/internal/tables"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
	"golang.org/x/sync/errgroup"
)

var errShutdownTimeout = errors.New("shutdown_timeout reached")

// runOnce runs one pipeline from the slot's confirmed position, in four
// stages whose shutdown rules DESIGN.md states ("One pipeline run"):
//
//   - connect: inspect the slot, open the replication connection and the
//     producer;
//   - start: derive the run's contexts and issue START_REPLICATION;
//   - stream: the stream, pipeline and watchdog goroutines, until one of
//     them ends;
//   - drain: wait for Kafka's acknowledgements, send the final status and
//     end the stream.
//
// It returns what the run achieved (outcome), with the server it streamed
// from for explain to read the catalogue there.
func (r *Relay) runOnce(ctx context.Context, a attempt) (outcome, error) {
	// A standby's slot is streamed by another process, which began only
	// once the backfill was done: the backfill is read when the slot is free.
	if r.cfg.Postgres.Backfill.On() && a.standby == nil {
		if err := r.backfill(ctx, a.first); err != nil {
			return outcome{}, err
		}
	}
	c, err := r.connectStage(ctx, a)
	if err != nil {
		return outcome{}, err
	}
	defer c.producer.Close()
	rn, err := r.startStage(ctx, c, a)
	if err != nil {
		return outcome{addr: c.slot.Addr}, err
	}
	defer rn.release()
	err = r.streamStage(ctx, rn)
	done, err := r.drainStage(ctx, rn, err)
	done.addr = c.slot.Addr
	return done, err
}

// connected is what the connect stage opened.
type connected struct {
	slot     preflight.Slot
	conn     *pgconn.PgConn // the replication connection
	producer *sink.Producer
	// server is, in exactly-once mode, the server as the run's replication
	// connection showed it before START_REPLICATION (producerFor).
	server delivery.Server
}

// connectStage inspects the slot and opens the replication connection and
// the producer, on what Check opened (a.first) for the first run. It leaves
// nothing open when it fails.
func (r *Relay) connectStage(ctx context.Context, a attempt) (connected, error) {
	slot, conn, err := r.check.Connect(ctx, a.first, a.history, a.standby)
	if err != nil {
		return connected{}, err
	}
	producer, server, err := r.producerFor(ctx, conn, a.first)
	if err != nil {
		conn.Close(context.Background())
		return connected{}, err
	}
	return connected{slot: slot, conn: conn, producer: producer, server: server}, nil
}

// pipelineRun is one run past its start stage.
type pipelineRun struct {
	connected
	tracker *checkpoint.Tracker
	stream  *wal.Stream
	// window is the relay's reshard window with the end the reshard gate
	// gave this run; windowEnded: the pipeline met its end (an old shard
	// past its cutover).
	window      shard.Window
	windowEnded atomic.Bool
	schemas     []router.Schema // the table schemas the run's routers are built from
	per         []config.Config // the outbox tables' configurations (attempt.per)
	// hard ends the run at once: shutdown_timeout after the caller's ctx
	// ends (with errShutdownTimeout as its cause), or when the run returns.
	// It does not end with the caller's ctx itself, so that a shutdown
	// drains.
	hard context.Context
	// ctx, derived from hard, ends on a record's delivery failure, with
	// the failure as its cause (fail).
	ctx  context.Context
	fail context.CancelCauseFunc
	// release undoes the start stage: it stops the shutdown timer, cancels
	// ctx and hard, and closes the slot-position connection.
	release func()
	// stopReading ends the stream at the next transaction boundary, as a
	// shutdown does (set by the stream stage): an old shard that has met
	// the end of its window reads no further.
	stopReading func()
}

// startStage derives the run's contexts (hard, then ctx), registers the
// shutdown timer on the caller's ctx, and starts replication from the
// slot's confirmed position. On failure it has closed the replication
// connection; the caller closes the producer either way.
func (r *Relay) startStage(ctx context.Context, c connected, a attempt) (*pipelineRun, error) {
	pg := r.cfg.Postgres
	hard, cancelHard := context.WithCancelCause(context.WithoutCancel(ctx))
	stopTimer := context.AfterFunc(ctx, func() {
		time.AfterFunc(r.cfg.ShutdownTimeout, func() { cancelHard(errShutdownTimeout) })
	})
	run, fail := context.WithCancelCause(hard)
	rn := &pipelineRun{connected: c, tracker: checkpoint.New(c.slot.Confirmed), hard: hard, ctx: run, fail: fail, window: r.window, schemas: a.schemas, per: a.per}
	rn.release = func() {
		fail(nil)
		stopTimer()
		cancelHard(nil)
	}
	stream, err := wal.StartStream(run, c.conn, wal.StreamConfig{
		Slot: pg.Slot, Publication: pg.Publication, StatusInterval: pg.StatusInterval, ConfirmInterval: pg.ConfirmInterval,
		ReceiveTimeout: r.receiveTimeout(run, c.conn),
		Messages:       r.cfg.Router.Messages.Prefix != "",
	}, 0, func() wal.LSN { return rn.window.Confirm(rn.tracker.Confirmed()) })
	if err != nil {
		c.conn.Close(context.Background())
		rn.release()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: another process took the slot first
			return nil, &wal.SlotActiveError{Slot: pg.Slot}
		}
		return nil, err
	}
	// The slot is ours now: a reshard under way may forbid streaming it,
	// or streaming it past its cutover (issue 32 item 5).
	lc := r.lazyConn()
	lc.Addr = c.slot.Addr // the run's server: the gate and the slot position read there
	upto, err := r.reshardGate(ctx, lc, c.slot.Confirmed)
	if err != nil {
		lc.Close()
		c.conn.Close(context.Background())
		rn.release()
		return nil, err
	}
	if !r.drain {
		rn.window.Upto = upto
	}
	rn.stream = stream
	tracker, producer := rn.tracker, c.producer
	var confirmedTxns uint64
	stream.OnStatus = func(written, flushed wal.LSN) {
		_, at, txns := tracker.Position()
		inFlight := tracker.InFlight()
		r.m.confirmedLSN.Set(float64(flushed))
		r.m.receivedLSN.Set(float64(written))
		r.m.inFlight.Set(float64(inFlight))
		r.m.bufferFill.Set(producer.Fill())
		r.m.confirmedTxns.Add(float64(txns - confirmedTxns))
		confirmedTxns = txns
		if !at.IsZero() {
			r.m.confirmedAt.Set(float64(at.UnixNano()) / 1e9)
		}
		r.status.SetPosition(flushed.String(), written.String(), at, inFlight)
	}
	stream.OnRoundTrip = func(d time.Duration) { r.m.roundTrip.Observe(d.Seconds()) }
	warned := map[string]bool{} // by SQLSTATE and function: a walsender repeats its warnings
	stream.OnWarning = func(w *pgconn.PgError) {
		if k := w.Code + " " + w.Routine; !warned[k] {
			warned[k] = true
			r.log.Warn("the server warned on the replication stream; streaming on (logged once per run)", "sqlstate", w.Code,
				"message", w.Message, "detail", w.Detail, "function", w.Routine)
		}
	}
	var closeSlotConn func()
	stream.SlotPosition, closeSlotConn = r.slotPosition(lc)
	release := rn.release
	rn.release = func() {
		closeSlotConn()
		release()
	}
	if a.standby != nil {
		r.log.Info("took over the slot from the previous holder", "slot", pg.Slot)
	}
	r.setState(StateStreaming, "")
	start := c.slot.Confirmed
	r.status.SetApplied(start.String()) // the slot's confirmed position, read as the run connected
	r.log.Info("streaming", "slot", pg.Slot, "lsn", start.String(), "publication", pg.Publication)
	return rn, nil
}

// streamStage runs the stream, pipeline and watchdog goroutines under one
// errgroup on rn.ctx until the first of them ends. When the caller's ctx
// ends, the stream stops reading at the next transaction boundary
// (graceful) and the pipeline drains the channel. It returns the delivery
// failure that ended the run, if one did, and else the group's error.
func (r *Relay) streamStage(ctx context.Context, rn *pipelineRun) error {
	g, gctx := errgroup.WithContext(rn.ctx)
	graceful, stopReading := context.WithCancel(gctx)
	defer stopReading()
	rn.stopReading = stopReading
	stopGraceful := context.AfterFunc(ctx, stopReading)
	defer stopGraceful()

	items := make(chan []wal.Item, 8) // batches of at most 256 items or 1 MiB of WAL
	g.Go(func() error {
		defer close(items)
		if err := rn.stream.Run(gctx, graceful, items); err != nil {
			return &preflight.StreamError{Err: err}
		}
		return nil
	})
	// A table dropped and created again, or swapped in by a rename, is a
	// relation the publication lacks: nothing on the stream shows it. A
	// table a pattern matches that the pipeline takes on while the run
	// streams joins the check (Setup.Learnt).
	per := rn.per
	if per == nil {
		var err error
		if per, err = r.cfg.PerTable(); err != nil {
			return err
		}
	}
	published := tables.NewWatch(r.cfg.Postgres, per, rn.slot.OutboxIDs, rn.slot.Addr, r.log)
	watch, stopWatch := context.WithCancel(gctx)
	g.Go(func() error {
		defer stopWatch() // the watchdog ends with the pipeline, also on a clean stop
		return r.pipe(gctx, items, rn, published.Add)
	})
	g.Go(func() error { return rn.producer.Watch(watch, rn.tracker.Waiting) })
	g.Go(func() error { return published.Run(watch, r.cfg.Postgres.SlotLagInterval) })
	err := g.Wait()
	if cause := context.Cause(rn.ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, errShutdownTimeout) {
		err = cause // the delivery failure that ended the run
	}
	return err
}

// drainStage ends a run whose goroutines have returned with err: after a
// clean stop it waits until Kafka acknowledged every record (bounded by
// hard), then sends the final status and ends the stream, with 5 s for it,
// or 1 s after a failure (the connection may be broken: the exit is not
// held up). It returns what the run achieved and its error.
func (r *Relay) drainStage(ctx context.Context, rn *pipelineRun, err error) (outcome, error) {
	pg := r.cfg.Postgres
	if err == nil {
		// A record that fails now never acknowledges: waiting on rn.ctx,
		// which the failure cancels, ends the wait at once with it
		// (possibly a record the fence stopped, reported before the
		// failure that broke the fence).
		if werr := awaitAcks(rn.ctx, rn.fail, rn.tracker, rn.producer); werr != nil {
			if cause := context.Cause(rn.ctx); !errors.Is(cause, errShutdownTimeout) {
				err = cause
			} else {
				r.log.Warn("shutdown timeout reached before Kafka acknowledged every record; they will be sent again on restart",
					"in_flight", rn.tracker.InFlight(), "slot", pg.Slot)
			}
		}
	}
	if err == nil && rn.windowEnded.Load() {
		// An old shard past its window: everything before the cutover is
		// acknowledged, and the transaction past it proves the slot holds
		// nothing else up to there. Confirm the cutover itself.
		rn.tracker.Idle(rn.window.Upto)
	}
	// A shutdown timeout is no failure of the connection, and is when the
	// server may be in the middle of a large transaction: it gets the
	// longer close.
	timedOut := errors.Is(context.Cause(rn.hard), errShutdownTimeout)
	if timedOut && errors.Is(err, context.Canceled) {
		err = fmt.Errorf("%w (%s) while a transaction was still being received or delivered", errShutdownTimeout, r.cfg.ShutdownTimeout)
	}
	closeTimeout := 5 * time.Second
	if err != nil && !timedOut {
		closeTimeout = time.Second
	}
	closeCtx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	cerr := rn.stream.Close(closeCtx)
	if cerr != nil && (err == nil || timedOut) {
		r.log.Warn("final status update failed; Postgres keeps the previous confirmed position", "err", cerr, "slot", pg.Slot)
	}
	done := outcome{confirmed: rn.window.Confirm(rn.tracker.Confirmed()), cutover: rn.window.Upto}
	if err == nil && cerr == nil && rn.window.Done(done.confirmed) {
		done.windowDelivered = true
		r.log.Info("delivered every transaction up to the reshard's cutover", "slot", pg.Slot, "cutover", rn.window.Upto.String())
	}
	r.m.confirmedLSN.Set(float64(done.confirmed))
	if err == nil && ctx.Err() != nil {
		r.log.Info("stopped", "slot", pg.Slot, "lsn", done.confirmed.String())
	}
	return done, err
}

// awaitAcks waits until Kafka has acknowledged every record tracker holds,
// or run ends (with the run's failure as its cause). The producer's
// watchdog runs meanwhile and fails run with its *sink.StallError after
// kafka.delivery_timeout without an acknowledgement: the stream stage's
// watchdog ended with the pipeline, and when the run ended cleanly without
// a shutdown (an old shard past its reshard window) nothing else would end
// the wait, so a broker outage at the cutover would hold the reshard
// without a word (issue 32 item 7).
func awaitAcks(run context.Context, fail context.CancelCauseFunc, tracker *checkpoint.Tracker, p *sink.Producer) error {
	watch, stopWatch := context.WithCancel(run)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if err := p.Watch(watch, tracker.Waiting); err != nil {
			fail(err)
		}
	}()
	defer func() { stopWatch(); <-watched }()
	return tracker.WaitAcked(run)
}

// receiveTimeout is postgres.receive_timeout, or else the server's
// wal_sender_timeout (60s when that is 0 or cannot be read), and at least
// twice the status interval: a live server answers each status update.
func (r *Relay) receiveTimeout(ctx context.Context, conn *pgconn.PgConn) time.Duration {
	pg := r.cfg.Postgres
	if pg.ReceiveTimeout > 0 {
		return pg.ReceiveTimeout
	}
	d, err := wal.SenderTimeout(ctx, conn)
	if err != nil {
		r.log.Warn("taking 60s as the receive timeout", "err", err)
	}
	if d <= 0 {
		d = time.Minute
	}
	return max(d, 2*pg.StatusInterval)
}

// slotPosition returns a function that reads the slot's confirmed position
// on lc, a connection of the run's own, and one that closes it.
func (r *Relay) slotPosition(lc *pg.Lazy) (read func(context.Context) (wal.LSN, error), closeConn func()) {
	read = func(ctx context.Context) (wal.LSN, error) {
		conn, err := lc.Get(ctx)
		if err != nil {
			return 0, err
		}
		info, ok, err := wal.InspectSlot(ctx, conn, r.cfg.Postgres.Slot)
		if err == nil && !ok {
			err = fmt.Errorf("replication slot %q does not exist", r.cfg.Postgres.Slot)
		}
		return info.ConfirmedFlushLSN, err
	}
	return read, lc.Close
}
