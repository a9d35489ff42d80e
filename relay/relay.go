package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/shard"
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
	timeline       int    // the timeline the slot was last used on
	timelineSystem string // the system identifier of its cluster, "" when unknown
	timelineWarned bool
	// newest is the highest timeline seen on any server (newestAt: where),
	// whether the slot was free or held there: a server on an older one is
	// refused (split brain). A standby instance of an HA pair records it at
	// each poll, before it ever holds the slot.
	newest       int
	newestAt     string
	newestSystem string // the system identifier of newest's cluster, "" when unknown
	major        int
	slotFailover bool
	// confirmed is the highest position this process confirmed while no
	// other process held or advanced the slot since (0: unknown, as in a
	// standby instance): the bound for a synchronised copy after a
	// promotion (replacedWhy).
	confirmed wal.LSN

	// Sharded slots (shards.go): this relay's shard of the configured
	// layout (Index 0 of Count 1 when unsharded), and while resharding
	// the window of an old shard; windowDone once it delivered all of it.
	shard      shard.Shard
	window     shard.Window
	windowDone bool
	past       atomic.Bool // this run's pipeline met the end of window
	drain      bool        // an old shard drained by this process's reshard loop
}

// New returns a Relay for a validated cfg, with its metrics on reg.
func New(cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (*Relay, error) {
	rt, err := router.New(cfg.Router)
	if err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, log: log, router: rt, m: newMetrics(reg), sinkM: sink.NewMetrics(reg), reg: reg,
		standby: pg.Lazy{PG: cfg.Postgres},
		shard:   shard.Shard{Index: 0, Count: 1, Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication}}
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
		addr, err := r.runOnce(ctx, start)
		start.Close() // only the first pipeline uses it, if it got that far
		start = nil
		if err == nil && r.windowDone {
			if r.drain {
				return nil // an old shard delivered its window: the reshard goes on
			}
			// Another instance's reshard: the new shards deliver the rest.
			r.windowDone = false
			err = &ReshardWaitError{Reason: "delivered every transaction up to the cutover " + r.window.Upto.String() + " of a reshard under way; the new shards deliver the rest"}
		}
		var wait *ReshardWaitError
		if errors.As(err, &wait) && ctx.Err() == nil {
			if st := r.Status(); st.State != StateStandby || st.Reason != wait.Reason {
				r.log.Info("not streaming the slot: a reshard is under way", "slot", r.cfg.Postgres.Slot, "reason", wait.Reason)
				r.setState(StateStandby, wait.Reason)
			}
			if !sleep(ctx, r.cfg.Postgres.StandbyPollInterval) {
				return nil
			}
			continue
		}
		if err != nil {
			err = r.explain(ctx, err, addr)
		}
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
