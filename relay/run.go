package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/internal/pg"
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
// addr is the server the run streamed from (pg.Addr; "" when the connect
// stage failed), for explain to read the catalogue there.
func (r *Relay) runOnce(ctx context.Context, warm *Start) (addr string, err error) {
	c, err := r.connectStage(ctx, warm)
	if err != nil {
		return "", err
	}
	defer c.producer.Close()
	rn, err := r.startStage(ctx, c)
	if err != nil {
		return c.slot.addr, err
	}
	defer rn.release()
	err = r.streamStage(ctx, rn)
	return c.slot.addr, r.drainStage(ctx, rn, err)
}

// connected is what the connect stage opened.
type connected struct {
	slot     slotStart
	conn     *pgconn.PgConn // the replication connection
	producer *sink.Producer
}

// connectStage inspects the slot and opens the replication connection and
// the producer, on what Check opened (warm) for the first run. It leaves
// nothing open when it fails.
func (r *Relay) connectStage(ctx context.Context, warm *Start) (connected, error) {
	slot, conn, err := r.connect(ctx, warm)
	if err != nil {
		return connected{}, err
	}
	producer, server, err := r.producerFor(ctx, conn, warm)
	if err != nil {
		conn.Close(context.Background())
		return connected{}, err
	}
	slot.server = server
	return connected{slot: slot, conn: conn, producer: producer}, nil
}

// pipelineRun is one run past its start stage.
type pipelineRun struct {
	connected
	tracker *checkpoint.Tracker
	stream  *wal.Stream
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
func (r *Relay) startStage(ctx context.Context, c connected) (*pipelineRun, error) {
	pg := r.cfg.Postgres
	hard, cancelHard := context.WithCancelCause(context.WithoutCancel(ctx))
	stopTimer := context.AfterFunc(ctx, func() {
		time.AfterFunc(r.cfg.ShutdownTimeout, func() { cancelHard(errShutdownTimeout) })
	})
	run, fail := context.WithCancelCause(hard)
	rn := &pipelineRun{connected: c, tracker: checkpoint.New(c.slot.confirmed), hard: hard, ctx: run, fail: fail}
	r.past.Store(false)
	rn.release = func() {
		fail(nil)
		stopTimer()
		cancelHard(nil)
	}
	stream, err := wal.StartStream(run, c.conn, wal.StreamConfig{
		Slot: pg.Slot, Publication: pg.Publication, StatusInterval: pg.StatusInterval, ConfirmInterval: pg.ConfirmInterval,
		ReceiveTimeout: r.receiveTimeout(run, c.conn),
		Messages:       r.cfg.Router.Messages.Prefix != "",
	}, 0, func() wal.LSN { return r.window.Confirm(rn.tracker.Confirmed()) })
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
	lc.Addr = c.slot.addr // the run's server: the gate and the slot position read there
	if err := r.reshardGate(ctx, lc, c.slot.confirmed); err != nil {
		lc.Close()
		c.conn.Close(context.Background())
		rn.release()
		return nil, err
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
		r.status.setPosition(flushed, written, at, inFlight)
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
	if r.Status().State == StateStandby {
		r.log.Info("took over the slot from the previous holder", "slot", pg.Slot)
	}
	r.setState(StateStreaming, "")
	start := c.slot.confirmed
	r.status.setApplied(start) // the slot's confirmed position, read as the run connected
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
			return &streamError{err}
		}
		return nil
	})
	watch, stopWatch := context.WithCancel(gctx)
	g.Go(func() error {
		defer stopWatch() // the watchdog ends with the pipeline, also on a clean stop
		return r.pipe(gctx, items, rn.tracker, rn.producer, rn.fail, rn.slot, rn.stopReading)
	})
	g.Go(func() error { return rn.producer.Watch(watch, rn.tracker.Waiting) })
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
// held up). It returns the run's error.
func (r *Relay) drainStage(ctx context.Context, rn *pipelineRun, err error) error {
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
	if err == nil && r.past.Load() {
		// An old shard past its window: everything before the cutover is
		// acknowledged, and the transaction past it proves the slot holds
		// nothing else up to there. Confirm the cutover itself.
		rn.tracker.Idle(r.window.Upto)
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
	confirmed := r.window.Confirm(rn.tracker.Confirmed())
	if err == nil && cerr == nil && r.window.Done(confirmed) {
		r.windowDone = true
		r.log.Info("delivered every transaction up to the reshard's cutover", "slot", pg.Slot, "cutover", r.window.Upto.String())
	}
	r.m.confirmedLSN.Set(float64(confirmed))
	r.confirmed = max(r.confirmed, confirmed)
	if err == nil && ctx.Err() != nil {
		r.log.Info("stopped", "slot", pg.Slot, "lsn", confirmed.String())
	}
	return err
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

// slotStart is what a pipeline's slot inspection read.
type slotStart struct {
	confirmed wal.LSN // the slot's confirmed position: where the run starts
	outboxID  uint32  // the outbox table's relation ID (0: no such table now)
	// addr is the server the slot was read on (pg.Addr), where the run
	// streams from: every connection of the run that decides about its
	// events (catalogue lookups, the slot's position, the exactly-once
	// timeline) goes there and nowhere else.
	addr string
	// server is, in exactly-once mode, the server as the run's replication
	// connection showed it before START_REPLICATION (producerFor).
	server runServer
}

// connect inspects the slot and opens the replication connection, on the
// connections in warm (Check's) when there are any. It opens both
// connections side by side, to start sooner, except in standby: there the
// slot is expected to be held, and a replication connection per poll would
// take a walsender place from the holder.
func (r *Relay) connect(ctx context.Context, warm *Start) (slotStart, *pgconn.PgConn, error) {
	if warm != nil && warm.conn != nil { // the first pipeline: Check's connections
		conn, repl := warm.conn, warm.repl
		warm.conn, warm.repl = nil, nil
		slot, err := r.inspectSlotOn(ctx, conn)
		closed := conn.IsClosed() || (repl != nil && repl.IsClosed())
		if !closed && err == nil && repl == nil {
			repl, err = r.replicationBeside(ctx, conn)
		}
		conn.Close(context.WithoutCancel(ctx))
		if closed { // the server closed one while it waited: open new ones
			if repl != nil {
				repl.Close(context.Background())
			}
			return r.connect(ctx, nil)
		}
		if err != nil {
			if repl != nil {
				repl.Close(context.Background())
			}
			return slotStart{}, nil, err
		}
		return slot, repl, nil
	}
	if r.Status().State == StateStandby {
		// A standby polls on one connection, kept until it takes over
		// (or a poll fails), not one per poll.
		conn, err := r.standby.Get(ctx)
		if err != nil {
			return slotStart{}, nil, err
		}
		slot, err := r.inspectSlotOn(ctx, conn)
		var active *wal.SlotActiveError
		if errors.As(err, &active) {
			return slotStart{}, nil, err
		}
		if err == nil { // a takeover
			err = r.refuseSplitBrain(ctx, conn, r.primaries(ctx))
		}
		var repl *pgconn.PgConn
		if err == nil {
			repl, err = r.replicationBeside(ctx, conn)
		}
		r.standby.Close()
		return slot, repl, err
	}
	type opened struct {
		conn *pgconn.PgConn
		err  error
	}
	repl := make(chan opened, 1)
	go func() {
		conn, err := r.connectReplication(ctx)
		repl <- opened{conn, err}
	}()
	others := make(chan []pg.Primary, 1)
	go func() { others <- r.primaries(ctx) }()
	slot, conn, err := r.inspectSlot(ctx)
	if err == nil {
		if err = r.refuseSplitBrain(ctx, conn, <-others); err != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}
	o := <-repl
	if err != nil {
		if o.conn != nil {
			o.conn.Close(context.Background())
		}
		return slotStart{}, nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Opened side by side, the two may have reached different servers of
	// postgres.dsn (two writable hosts): the run streams from the one the
	// slot was read on, or not at all.
	if o.conn = besideOrClose(conn, o.conn); o.conn == nil {
		o.conn, o.err = r.replicationBeside(ctx, conn)
	}
	if o.err != nil {
		return slotStart{}, nil, o.err
	}
	return slot, o.conn, nil
}

// primaries asks every host of postgres.dsn and postgres.standby_dsns,
// within 5 s, whether it is a primary and on which timeline (pg.Primaries;
// nothing to ask with one host): at every pipeline start but the first
// (Check asked) and at every takeover, a process that has not seen the
// newest timeline (a standby instance, or one restarted while the new
// primary was away) must not stream from an old primary.
func (r *Relay) primaries(ctx context.Context) []pg.Primary {
	return pg.Primaries(ctx, r.cfg.Postgres, 5*time.Second)
}

// inspectSlot checks the slot before a run, on a connection of its own,
// which it returns open unless it fails.
func (r *Relay) inspectSlot(ctx context.Context) (slotStart, *pgx.Conn, error) {
	conn, err := pg.Connect(ctx, r.cfg.Postgres)
	if err != nil {
		return slotStart{}, nil, err
	}
	slot, err := r.inspectSlotOn(ctx, conn)
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return slotStart{}, nil, err
	}
	return slot, conn, nil
}

// inspectSlotOn is inspectSlot on an open connection.
func (r *Relay) inspectSlotOn(ctx context.Context, conn *pgx.Conn) (slotStart, error) {
	if err := refuseStandby(ctx, conn); err != nil {
		return slotStart{}, err
	}
	if tli, err := wal.Timeline(ctx, conn); err == nil {
		system := pg.SystemID(ctx, conn)
		if err := r.refuseOlderTimeline(serverAddr(conn), system, tli); err != nil {
			return slotStart{}, err
		}
		r.sawTimeline(serverAddr(conn), system, tli) // also while another process holds the slot
	}
	info, ok, err := wal.InspectSlot(ctx, conn, r.cfg.Postgres.Slot)
	if err != nil {
		return slotStart{}, err
	}
	if info.Active {
		r.confirmed = 0 // another process holds the slot (Relay.confirmed)
	}
	if !ok {
		return slotStart{}, r.slotMissing(ctx, conn)
	}
	// The outbox table's relation ID tells its rows after a rename.
	var db string
	var outboxID uint32
	schema, table := r.cfg.Postgres.TableName()
	if err := conn.QueryRow(ctx, "SELECT current_database(), coalesce(to_regclass($1)::oid, 0)", pgx.Identifier{schema, table}.Sanitize()).
		Scan(&db, &outboxID); err != nil {
		return slotStart{}, fmt.Errorf("reading current database: %w", err)
	}
	if err := r.checkSlot(ctx, conn, info, db); err != nil {
		return slotStart{}, err
	}
	if err := r.noteSlot(ctx, conn, info); err != nil {
		return slotStart{}, err
	}
	return slotStart{confirmed: info.ConfirmedFlushLSN, outboxID: outboxID, addr: pg.Addr(conn.PgConn().Conn())}, nil
}
