package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// Relay streams one outbox table to Kafka.
type Relay struct {
	cfg    config.Config
	log    *slog.Logger
	router *router.Router
	m      *metrics
	sinkM  *sink.Metrics
	txnM   *sink.TxnMetrics // exactly_once only
	txnID  string           // exactly_once: the last pipeline's transactional id

	reg     prometheus.Registerer
	standby pg.Lazy // a standby's connection for its polls
	status  status
	// What the last pipeline start saw, to tell a promotion from a dropped
	// slot (see slotMissing).
	timeline       int
	timelineWarned bool
	major          int
	slotFailover   bool
	confirmed      wal.LSN // the highest position this process confirmed
}

// New returns a Relay for a validated cfg, with its metrics on reg.
func New(cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (*Relay, error) {
	rt, err := router.New(cfg.Router)
	if err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, log: log, router: rt, m: newMetrics(reg), sinkM: sink.NewMetrics(reg), reg: reg,
		standby: pg.Lazy{PG: cfg.Postgres}}
	if cfg.Kafka.ExactlyOnce() {
		r.txnM = sink.NewTxnMetrics(reg)
	}
	r.status.setState(StateStarting, "starting up")
	return r, nil
}

func (r *Relay) newProducer() (*sink.Producer, error) {
	return sink.New(r.cfg.Kafka, r.sinkM, r.log)
}

// producer returns the client Check warmed (in start) to the first
// pipeline, and a new one to every other.
func (r *Relay) producer(start *Start) (*sink.Producer, error) {
	if p := start.takeProducer(); p != nil {
		return p, nil
	}
	return r.newProducer()
}

// IsPermanent reports whether err is one that a pipeline restart cannot fix:
// Run returns it instead of restarting.
func IsPermanent(err error) bool {
	var rowErr *router.RowError
	var layoutErr *router.LayoutError
	var decErr *wal.DecodeError
	var delivery *sink.DeliveryError
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &rowErr), errors.As(err, &layoutErr), errors.As(err, &decErr), errors.Is(err, errUpdate),
		errors.Is(err, wal.ErrSlotMissing), errors.Is(err, wal.ErrSlotLost), errors.Is(err, wal.ErrPublicationMissing):
		return true
	case errors.As(err, &delivery) && delivery.Rejected():
		return true
	case errors.As(err, &pgErr):
		switch pgErr.Code {
		case "42704", // undefined_object: the publication or slot is gone
			"55000",          // object_not_in_prerequisite_state: the slot was invalidated
			"28000", "28P01", // authentication
			"42501": // insufficient_privilege
			return true
		}
	}
	return false
}

// Run streams until ctx is done, restarting after retryable failures. While
// another process holds the slot it waits as a standby and takes over when
// the slot is released. It returns nil after a clean shutdown and the error
// for a fatal failure. start is what Check returned, taken over by the first
// pipeline and closed by Run; with nil the first pipeline opens its own.
func (r *Relay) Run(ctx context.Context, start *Start) error {
	// At most 10 s between restarts (Kafka Connect's default for retriable
	// errors too): after a long outage the pipeline is back within 10 s of
	// the service, and each restart costs Postgres a re-decode from the
	// slot's restart_lsn, which a shorter cap would repeat more often.
	const minBackoff, maxBackoff = 500 * time.Millisecond, 10 * time.Second
	backoff := minBackoff
	defer r.setState(StateStopped, "stopped")
	defer r.standby.Close()
	defer start.Close()
	for {
		started := time.Now()
		err := r.runOnce(ctx, start)
		start.Close() // only the first pipeline uses it, if it got that far
		start = nil
		if ctx.Err() != nil && (err == nil || !IsPermanent(err)) {
			if err != nil {
				r.log.Warn("stopped after an error during shutdown; unconfirmed events will be sent again on restart", "err", err, "slot", r.cfg.Postgres.Slot)
			}
			return nil
		}
		if err == nil {
			err = errors.New("replication stream ended without an error")
		}
		var active *wal.SlotActiveError
		if errors.As(err, &active) {
			if r.Status().State != StateStandby {
				r.log.Info("standby: another process holds the slot; taking over when it is released",
					"slot", r.cfg.Postgres.Slot, "holder_pid", active.PID)
				r.setState(StateStandby, err.Error())
			}
			if !sleep(ctx, r.cfg.Postgres.StandbyPollInterval) {
				return nil
			}
			continue
		}
		err = r.explain(err)
		r.status.setError(err)
		if IsPermanent(err) {
			return err
		}
		if time.Since(started) > time.Minute {
			backoff = minBackoff
		}
		r.setState(StateStarting, "restarting after: "+err.Error())
		r.log.Warn("pipeline stopped; restarting from the slot's confirmed position", "err", err, "slot", r.cfg.Postgres.Slot, "retry_in", backoff)
		r.m.restarts.Inc()
		if !sleep(ctx, backoff) {
			return nil
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

// explain turns server errors whose meaning for the events is not obvious
// into ones that say it and what to do.
func (r *Relay) explain(err error) error {
	if r.cfg.Kafka.ExactlyOnce() {
		err = sink.AsFenced(r.txnID, err) // a record refused as fenced
	}
	var delivery *sink.DeliveryError
	if errors.As(err, &delivery) && delivery.Rejected() {
		return fmt.Errorf("%w. Kafka will refuse it again, so outboxd stopped without confirming past it; fix the record or the topic's "+
			"configuration and restart", delivery)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !(pgErr.Code == "42704" && strings.Contains(pgErr.Message, "publication") ||
		wal.PublicationSkipped(pgErr.Code, pgErr.Message)) {
		return err
	}
	pg := r.cfg.Postgres
	schema, table := pg.TableName()
	return wal.Errorf(wal.ErrPublicationMissing, "publication %q was dropped while outboxd used it (%s): Postgres can no longer decode the slot, "+
		"so the events committed after the slot's confirmed position stay in the slot, undelivered but not confirmed. "+
		"Recreate it with %s and restart outboxd; transactions Postgres still cannot decode "+
		"must be recovered from the outbox table or the application before the slot is advanced past them",
		pg.Publication, pgErr.Message, wal.PublicationSQL(pg.Publication, schema, table))
}

func (r *Relay) setState(state State, reason string) {
	r.status.setState(state, reason)
	r.m.setState(state)
	if state != StateStreaming {
		// Only a streaming run has records in flight; a standby must not
		// keep reporting the buffer it had while it held the slot.
		r.m.inFlight.Set(0)
		r.m.bufferFill.Set(0)
	}
}

// sleep waits d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

var errShutdownTimeout = errors.New("shutdown_timeout reached")

// runOnce runs one pipeline from the slot's confirmed position.
func (r *Relay) runOnce(ctx context.Context, warm *Start) error {
	pg := r.cfg.Postgres
	slot, conn, err := r.connect(ctx, warm)
	if err != nil {
		return err
	}
	start := slot.confirmed
	producer, err := r.producerFor(ctx, conn, warm)
	if err != nil {
		conn.Close(context.Background())
		return err
	}
	defer producer.Close()

	// hard ends the run at once; it is cut shutdown_timeout after ctx ends.
	hard, cancelHard := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelHard(nil)
	stopTimer := context.AfterFunc(ctx, func() {
		time.AfterFunc(r.cfg.ShutdownTimeout, func() { cancelHard(errShutdownTimeout) })
	})
	defer stopTimer()
	// run ends on a delivery failure, with the failure as its cause.
	run, fail := context.WithCancelCause(hard)
	defer fail(nil)

	tracker := checkpoint.New(start)
	stream, err := wal.StartStream(run, conn, wal.StreamConfig{
		Slot: pg.Slot, Publication: pg.Publication, StatusInterval: pg.StatusInterval,
		ReceiveTimeout: r.receiveTimeout(run, conn),
		Messages:       r.cfg.Router.Messages.Prefix != "",
	}, 0, tracker.Confirmed)
	if err != nil {
		conn.Close(context.Background())
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: another process took the slot first
			return &wal.SlotActiveError{Slot: pg.Slot}
		}
		return err
	}
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
	var closeSlotConn func()
	stream.SlotPosition, closeSlotConn = r.slotPosition()
	defer closeSlotConn()
	if r.Status().State == StateStandby {
		r.log.Info("took over the slot from the previous holder", "slot", pg.Slot)
	}
	r.setState(StateStreaming, "")
	r.status.setApplied(start) // the slot's confirmed position, read as the run connected
	r.log.Info("streaming", "slot", pg.Slot, "lsn", start.String(), "publication", pg.Publication)

	g, gctx := errgroup.WithContext(run)
	graceful, stopReading := context.WithCancel(gctx)
	defer stopReading()
	stopGraceful := context.AfterFunc(ctx, stopReading)
	defer stopGraceful()

	items := make(chan []wal.Item, 8) // batches of at most 256 items or 1 MiB of WAL
	g.Go(func() error {
		defer close(items)
		return stream.Run(gctx, graceful, items)
	})
	watch, stopWatch := context.WithCancel(gctx)
	g.Go(func() error {
		defer stopWatch() // the watchdog ends with the pipeline, also on a clean stop
		return r.pipe(gctx, items, tracker, producer, fail, slot.outboxID)
	})
	g.Go(func() error { return producer.Watch(watch, tracker.Waiting) })
	err = g.Wait()
	if cause := context.Cause(run); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, errShutdownTimeout) {
		err = cause // the delivery failure that ended the run
	}
	if err == nil {
		// A record that fails now never acknowledges: waiting on run, which
		// the failure cancels, ends the wait at once with it (possibly a
		// record the fence stopped, reported before the failure that broke
		// the fence).
		if werr := tracker.WaitAcked(run); werr != nil {
			if cause := context.Cause(run); !errors.Is(cause, errShutdownTimeout) {
				err = cause
			} else {
				r.log.Warn("shutdown timeout reached before Kafka acknowledged every record; they will be sent again on restart",
					"in_flight", tracker.InFlight(), "slot", pg.Slot)
			}
		}
	}
	// After a failure the connection may be broken: do not hold the exit
	// up. A shutdown timeout is no failure of the connection, and is when
	// the server may be in the middle of a large transaction.
	timedOut := errors.Is(context.Cause(hard), errShutdownTimeout)
	if timedOut && errors.Is(err, context.Canceled) {
		err = fmt.Errorf("%w (%s) while a transaction was still being received or delivered", errShutdownTimeout, r.cfg.ShutdownTimeout)
	}
	closeTimeout := 5 * time.Second
	if err != nil && !timedOut {
		closeTimeout = time.Second
	}
	closeCtx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if cerr := stream.Close(closeCtx); cerr != nil && (err == nil || timedOut) {
		r.log.Warn("final status update failed; Postgres keeps the previous confirmed position", "err", cerr, "slot", pg.Slot)
	}
	r.m.confirmedLSN.Set(float64(tracker.Confirmed()))
	r.confirmed = max(r.confirmed, tracker.Confirmed())
	if err == nil && ctx.Err() != nil {
		r.log.Info("stopped", "slot", pg.Slot, "lsn", tracker.Confirmed().String())
	}
	return err
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
// on a connection of its own, opened at the first call, and one that closes
// that connection.
func (r *Relay) slotPosition() (read func(context.Context) (wal.LSN, error), closeConn func()) {
	lc := &pg.Lazy{PG: r.cfg.Postgres}
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
		conn.Close(context.WithoutCancel(ctx))
		if closed { // the server closed one while it waited: open new ones
			if repl != nil {
				repl.Close(context.Background())
			}
			return r.connect(ctx, nil)
		}
		if err == nil && repl == nil {
			repl, err = r.connectReplication(ctx)
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
		r.standby.Close()
		if err != nil {
			return slotStart{}, nil, err
		}
		repl, err := r.connectReplication(ctx)
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
	slot, err := r.inspectSlot(ctx)
	o := <-repl
	if err == nil {
		err = o.err
	}
	if err != nil {
		if o.conn != nil {
			o.conn.Close(context.Background())
		}
		return slotStart{}, nil, err
	}
	return slot, o.conn, nil
}

// inspectSlot checks the slot before a run.
func (r *Relay) inspectSlot(ctx context.Context) (slotStart, error) {
	conn, err := pg.Connect(ctx, r.cfg.Postgres)
	if err != nil {
		return slotStart{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return r.inspectSlotOn(ctx, conn)
}

// inspectSlotOn is inspectSlot on an open connection.
func (r *Relay) inspectSlotOn(ctx context.Context, conn *pgx.Conn) (slotStart, error) {
	if err := refuseStandby(ctx, conn); err != nil {
		return slotStart{}, err
	}
	info, ok, err := wal.InspectSlot(ctx, conn, r.cfg.Postgres.Slot)
	if err != nil {
		return slotStart{}, err
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
	return slotStart{confirmed: info.ConfirmedFlushLSN, outboxID: outboxID}, nil
}
