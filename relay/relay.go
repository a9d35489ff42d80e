package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/backfill"
	"github.com/outboxd/outboxd/internal/pause"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/internal/preflight"
	report "github.com/outboxd/outboxd/internal/status"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// Relay streams one outbox table to Kafka: Run supervises its pipeline
// runs (run.go), each of which inspects the slot (package
// internal/preflight), streams and drains.
type Relay struct {
	cfg   config.Config
	log   *slog.Logger
	check *preflight.Checker
	m     *metrics
	sinkM *sink.Metrics
	txnM  *sink.TxnMetrics // exactly_once only
	txnID string           // exactly_once: the last pipeline's transactional id

	reg    prometheus.Registerer
	status report.Tracker

	// Sharded slots (shards.go): this relay's shard of the configured
	// layout (Index 0 of Count 1 when unsharded), and while resharding the
	// window of an old shard, or the start of a new shard's. Shards sets
	// them before Run; a run never writes them.
	shard  shard.Shard
	window shard.Window
	drain  bool // an old shard drained by this process's reshard loop

	backfillM *backfill.Metrics // postgres.backfill only
}

// backfill sends the rows of postgres.backfill that Kafka has not
// acknowledged yet, with a Kafka client of its own (in exactly-once mode the
// slot's transactional producer: backfillTransactions), before the run issues
// START_REPLICATION (package backfill's duty 2). A run that finds it done
// goes on at once. While it sends, the connections and client Check opened
// for the first run (first) would idle: they are closed, and the run opens
// its own.
func (r *Relay) backfill(ctx context.Context, first *Checked) error {
	bf, err := backfill.Open(ctx, r.cfg, r.log)
	if bf == nil || err != nil {
		return err
	}
	defer bf.Close()
	first.Close()
	r.setState(StateStarting, "backfilling the rows already in the table")
	progress := func(sent, total int64) {
		r.setState(StateStarting, fmt.Sprintf("backfilling the rows already in the table: %d of %d sent, %d left (postgres.backfill)", sent, total, max(total-sent, 0)))
	}
	if r.cfg.Kafka.ExactlyOnce() {
		p, committed, err := r.backfillTransactions(ctx)
		if err != nil {
			return err
		}
		defer p.Close()
		return bf.RunExactlyOnce(ctx, p, committed, r.backfillM, progress)
	}
	p, err := r.newProducer()
	if err != nil {
		return err
	}
	defer p.Close()
	return bf.Run(ctx, p, r.backfillM, progress)
}

// New returns a Relay for a validated cfg, with its metrics on reg.
func New(cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (*Relay, error) {
	return newShard(cfg, log, reg, shard.Shard{Index: 0, Count: 1, Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication})
}

// newShard is New for shard sh, whose slot and publication cfg names.
func newShard(cfg config.Config, log *slog.Logger, reg prometheus.Registerer, sh shard.Shard) (*Relay, error) {
	if _, err := router.New(cfg.Router, router.Schema{}); err != nil {
		return nil, err
	}
	// Every router of this relay's runs gives the same run id.
	if h := &cfg.Router.DebeziumHeaders; h.Enabled && h.RunID == "" {
		h.RunID = router.RunID()
	}
	r := &Relay{cfg: cfg, log: log, m: newMetrics(reg), sinkM: sink.NewMetrics(reg), reg: reg, shard: sh}
	r.check = preflight.New(cfg, sh, log, r.newProducer, r.progress)
	if cfg.Kafka.ExactlyOnce() {
		r.txnM = sink.NewTxnMetrics(reg)
	}
	if cfg.Postgres.Backfill.On() {
		r.backfillM = backfill.NewMetrics(reg)
	}
	r.status.SetState(StateStarting, "starting up")
	return r, nil
}

// progress is what this process last confirmed, for the checks' messages.
func (r *Relay) progress() preflight.Progress {
	st := r.Status()
	return preflight.Progress{SentLSN: st.SentLSN, CommitTime: st.ConfirmedCommitTime, ConfirmedLSN: st.ConfirmedLSN}
}

func (r *Relay) newProducer() (*sink.Producer, error) {
	return sink.New(r.cfg.Kafka, r.sinkM, r.log)
}

// producer returns the client Check warmed to the first pipeline, and a
// new one to every other.
func (r *Relay) producer(first *Checked) (*sink.Producer, error) {
	if p := first.TakeProducer(); p != nil {
		return p, nil
	}
	return r.newProducer()
}

// Checked is what the start-up checks (Check) found and opened, handed to
// Run: the table schema the router is built from, the slot's history, and
// the connections and warmed Kafka client of the first pipeline. Run takes
// it over; when Run will not be called, Close closes it. A nil *Checked is
// a start without checks: nothing known, nothing opened.
type Checked = preflight.Checked

// Check runs the start-up checks and prepares the publication and slot
// (preflight.Checker.Check). On error it has closed everything and returns
// a nil *Checked.
func (r *Relay) Check(ctx context.Context) (*Checked, error) {
	c, err := r.check.Check(ctx, preflight.History{})
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// Run streams until ctx is done, restarting after retryable failures. While
// another process holds the slot it waits as a standby and takes over when
// the slot is released. It returns nil after a clean shutdown and the error
// for a fatal failure. checked is what Check returned, taken over by the
// first pipeline and closed by Run; with nil the first pipeline opens its
// own.
func (r *Relay) Run(ctx context.Context, checked *Checked) error {
	_, err := r.supervise(ctx, checked, r.runOnce, realClock{})
	return err
}

// A clock tells the time and waits; tests pass their own.
type clock interface {
	Now() time.Time
	// Sleep waits d or until ctx is done; it reports whether d passed.
	Sleep(ctx context.Context, d time.Duration) bool
}

type realClock struct{}

func (realClock) Now() time.Time                                  { return time.Now() }
func (realClock) Sleep(ctx context.Context, d time.Duration) bool { return pause.For(ctx, d) }

// attempt is what the supervisor hands to one pipeline run.
type attempt struct {
	first   *Checked           // the start-up checks' connections and client: the first run only, else nil
	schemas []router.Schema    // the table schemas the checks read, which each run's routers are built from
	per     []config.Config    // the outbox tables the checks found (preflight.Checked.Per); nil: config.Config.PerTable
	history *preflight.History // the slot's history, which each inspection adds to
	standby *pg.Lazy           // while standing by: the connection the polls share; else nil
}

// outcome is what one pipeline run achieved.
type outcome struct {
	addr      string  // the server the run streamed from (pg.Addr; "" when the connect stage failed)
	confirmed wal.LSN // the position it confirmed when it ended, 0 when it did not stream
	// windowDelivered: an old shard's run delivered its reshard window (to
	// cutover, the window's end as the run took it).
	windowDelivered bool
	cutover         wal.LSN
}

// supervised is how supervise ended.
type supervised struct {
	history         preflight.History // the slot's history as the runs left it
	windowDelivered bool              // an old shard (drain) delivered its reshard window
}

// runFunc is one pipeline run: runOnce, or a test's.
type runFunc func(ctx context.Context, a attempt) (outcome, error)

// At most 10 s between restarts (Kafka Connect's default for retriable
// errors too): after a long outage the pipeline is back within 10 s of the
// service, and each restart costs Postgres a re-decode from the slot's
// restart_lsn, which a shorter cap would repeat more often. A run that
// lasted longer than backoffReset starts the backoff again from its
// minimum.
const minBackoff, maxBackoff, backoffReset = 500 * time.Millisecond, 10 * time.Second, time.Minute

// supervise is Run's loop over pipeline runs (run), with clock's time. It
// returns the slot's history as the runs left it, and whether an old shard
// (drain) delivered its reshard window.
func (r *Relay) supervise(ctx context.Context, checked *Checked, run runFunc, clock clock) (ended supervised, err error) {
	backoff := minBackoff
	defer r.setState(StateStopped, "stopped")
	standby := &pg.Lazy{PG: r.cfg.Postgres}
	defer standby.Close()
	defer checked.Close()
	history, schemas, per := &ended.history, []router.Schema(nil), []config.Config(nil)
	if checked != nil {
		*history, schemas, per = checked.History, checked.Schemas, checked.Per
	}
	for {
		started := clock.Now()
		a := attempt{first: checked, schemas: schemas, per: per, history: history}
		if r.Status().State == StateStandby {
			a.standby = standby
		}
		done, err := run(ctx, a)
		checked.Close() // only the first pipeline uses it, if it got that far
		checked = nil
		history.Confirmed(done.confirmed)
		if err == nil && done.windowDelivered {
			if r.drain {
				ended.windowDelivered = true
				return ended, nil // an old shard delivered its window: the reshard goes on
			}
			// Another instance's reshard: the new shards deliver the rest.
			err = &ReshardWaitError{Reason: "delivered every transaction up to the cutover " + done.cutover.String() + " of a reshard under way; the new shards deliver the rest"}
		}
		var wait *ReshardWaitError
		if errors.As(err, &wait) && ctx.Err() == nil {
			if st := r.Status(); st.State != StateStandby || st.Reason != wait.Reason {
				r.log.Info("not streaming the slot: a reshard is under way", "slot", r.cfg.Postgres.Slot, "reason", wait.Reason)
				r.setState(StateStandby, wait.Reason)
			}
			if !clock.Sleep(ctx, r.cfg.Postgres.StandbyPollInterval) {
				return ended, nil
			}
			continue
		}
		if err != nil {
			err = r.explain(ctx, err, done.addr, history)
		}
		if ctx.Err() != nil && (err == nil || !IsPermanent(err)) {
			if err != nil {
				r.log.Warn("stopped after an error during shutdown; unconfirmed events will be sent again on restart", "err", err, "slot", r.cfg.Postgres.Slot)
			}
			return ended, nil
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
			if !clock.Sleep(ctx, r.cfg.Postgres.StandbyPollInterval) {
				return ended, nil
			}
			continue
		}
		r.status.SetError(err)
		if IsPermanent(err) {
			return ended, err
		}
		if clock.Now().Sub(started) > backoffReset {
			backoff = minBackoff
		}
		r.setState(StateStarting, "restarting after: "+err.Error())
		r.log.Warn("pipeline stopped; restarting from the slot's confirmed position", "err", err, "slot", r.cfg.Postgres.Slot, "retry_in", backoff)
		r.m.restarts.Inc()
		if !clock.Sleep(ctx, backoff) {
			return ended, nil
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

func (r *Relay) setState(state State, reason string) {
	r.status.SetState(state, reason)
	r.m.setState(state)
	if state != StateStreaming {
		// Only a streaming run has records in flight; a standby must not
		// keep reporting the buffer it had while it held the slot.
		r.m.inFlight.Set(0)
		r.m.bufferFill.Set(0)
	}
}
