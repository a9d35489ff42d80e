package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/outboxd/outboxd/internal/pause"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/delivery"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/internal/preflight"
	"github.com/outboxd/outboxd/internal/reshard"
	"github.com/outboxd/outboxd/internal/slotlag"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// Shards runs one outboxd: the reshard loop at start-up (package
// internal/reshard, driving shard.Next), then one Relay per shard of
// postgres.shards, each with its own replication connection, producer,
// tracker and confirmations, and its own slot-lag monitor. With
// postgres.shards: 1 and nothing to reshard it is one Relay, as before
// sharding: the same slot, publication, metrics and status.
//
// Start runs the reshard loop and the start-up checks and returns the
// Started shards, whose Run supervises them under one errgroup: the first
// to fail permanently ends them all.
type Shards struct {
	cfg config.Config
	log *slog.Logger
	reg prometheus.Registerer

	streams []*Relay // the shards to stream, in shard order
	lags    []*slotlag.Monitor

	mu       sync.Mutex
	note     string               // what the reshard loop is doing, while it runs
	draining map[string]*oldShard // old shards, by slot, while resharding
}

// oldShard is an old shard drained by this process's reshard loop, with
// the slot's history as its last drain left it.
type oldShard struct {
	relay   *Relay
	history preflight.History
}

// NewShards returns the Shards of a validated cfg, with the metrics of each
// shard on reg: with a constant label slot="<the shard's slot>" when
// postgres.shards > 1, without one otherwise.
func NewShards(cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (*Shards, error) {
	s := &Shards{cfg: cfg, log: log, reg: reg, draining: map[string]*oldShard{}}
	n := cfg.Postgres.Shards
	if n <= 1 {
		r, err := New(cfg, log, reg)
		if err != nil {
			return nil, err
		}
		s.streams = []*Relay{r}
		s.lags = []*slotlag.Monitor{slotlag.New(cfg.Postgres, log, reg)}
		return s, nil
	}
	slots, err := shard.Names(cfg.Postgres.Slot, n)
	if err != nil {
		return nil, fmt.Errorf("postgres.slot: %w", err)
	}
	pubs, err := shard.Names(cfg.Postgres.Publication, n)
	if err != nil {
		return nil, fmt.Errorf("postgres.publication: %w", err)
	}
	for i := range n {
		sh := shard.Shard{Index: i, Count: n, Slot: slots[i], Publication: pubs[i]}
		sreg := prometheus.WrapRegistererWith(prometheus.Labels{"slot": sh.Slot}, reg)
		r, err := newShardRelay(cfg, log, sreg, sh, shard.Window{})
		if err != nil {
			return nil, err
		}
		s.streams = append(s.streams, r)
		s.lags = append(s.lags, slotlag.New(r.cfg.Postgres, r.log, sreg))
	}
	return s, nil
}

// newShardRelay returns the Relay of shard sh with window w.
func newShardRelay(cfg config.Config, log *slog.Logger, reg prometheus.Registerer, sh shard.Shard, w shard.Window) (*Relay, error) {
	cfg.Postgres.Slot, cfg.Postgres.Publication = sh.Slot, sh.Publication
	if sh.Count > 1 {
		log = log.With("shard", fmt.Sprintf("%d/%d", sh.Index, sh.Count))
	}
	r, err := newShard(cfg, log, reg, sh)
	if err != nil {
		return nil, err
	}
	r.window = w
	return r, nil
}

// Start reshards when the slots in the database are not those of
// postgres.shards (or a reshard is recorded), makes the shards'
// publications, and runs each shard's start-up checks. It returns the
// shards ready to stream, or the first error, with everything it opened
// closed.
func (s *Shards) Start(ctx context.Context) (*Started, error) {
	if err := s.reshard(ctx, false); err != nil {
		return nil, err
	}
	s.setNote("")
	checked := make([]*Checked, len(s.streams))
	g, gctx := errgroup.WithContext(ctx)
	for i, r := range s.streams {
		g.Go(func() error {
			c, err := r.Check(gctx)
			checked[i] = c
			if err != nil && len(s.streams) > 1 {
				err = fmt.Errorf("shard %d of %d (slot %s): %w", r.shard.Index, r.shard.Count, r.cfg.Postgres.Slot, err)
			}
			return err
		})
	}
	started := &Started{shards: s, checked: checked}
	if err := g.Wait(); err != nil {
		started.Close()
		return nil, err
	}
	return started, nil
}

// Started is the shards past their start-up checks, each with what its
// checks found and opened (Checked). Run streams them; when Run will not
// be called, Close closes what the checks opened.
type Started struct {
	shards  *Shards
	checked []*Checked // by shard, in shard order
}

// Run streams every shard until ctx is done or one fails permanently, which
// ends the others; it returns that error. It takes over what the checks
// opened.
func (st *Started) Run(ctx context.Context) error {
	s := st.shards
	g, gctx := errgroup.WithContext(ctx)
	// A shard's end (cleanly or not) ends the slot-lag monitors.
	runCtx, endAll := context.WithCancel(gctx)
	defer endAll()
	var pipes sync.WaitGroup
	for i, r := range s.streams {
		checked := st.checked[i]
		st.checked[i] = nil // Run closes it
		pipes.Add(1)
		g.Go(func() error { defer pipes.Done(); return r.Run(runCtx, checked) })
		g.Go(func() error { return s.lags[i].Run(runCtx, r.SlotConfirmed) })
	}
	go func() { pipes.Wait(); endAll() }()
	return g.Wait()
}

// Close closes what the checks opened and Run has not taken over. It is
// safe more than once.
func (st *Started) Close() {
	for i, c := range st.checked {
		c.Close()
		st.checked[i] = nil
	}
}

// Status reports the shards' state: with one shard and nothing being
// resharded, that relay's Status; otherwise the worst state of the shards
// (the reshard's step as the reason while it runs) with each shard's Status
// in Shards.
func (s *Shards) Status() Status {
	s.mu.Lock()
	note := s.note
	var drains []*Relay
	for _, old := range s.draining {
		drains = append(drains, old.relay)
	}
	s.mu.Unlock()
	if len(s.streams) == 1 && note == "" && len(drains) == 0 {
		return s.streams[0].Status()
	}
	agg := Status{Slot: s.cfg.Postgres.Slot, State: StateStreaming}
	rank := map[State]int{StateStreaming: 0, StateStandby: 1, StateStarting: 2, StateStopped: 3}
	for _, r := range append(drains, s.streams...) {
		st := r.Status()
		agg.Shards = append(agg.Shards, st)
		agg.InFlight += st.InFlight
		if rank[st.State] > rank[agg.State] {
			agg.State = st.State
		}
		if agg.Reason == "" && st.Reason != "" {
			agg.Reason = st.Slot + ": " + st.Reason
		}
		if st.Since.After(agg.Since) {
			agg.Since = st.Since
		}
		if st.LastErrorTime.After(agg.LastErrorTime) {
			agg.LastError, agg.LastErrorTime = st.Slot+": "+st.LastError, st.LastErrorTime
		}
	}
	if note != "" {
		agg.State, agg.Reason = StateStarting, note
	}
	return agg
}

// Ready reports whether every shard is ready (streaming and making
// progress), with Status.
func (s *Shards) Ready() (bool, Status) {
	st := s.Status()
	if len(st.Shards) == 0 {
		return st.State == StateStreaming && st.Reason == "", st
	}
	ok := st.Reason == ""
	for _, sh := range st.Shards {
		ok = ok && sh.State == StateStreaming && sh.Reason == ""
	}
	return ok, st
}

func (s *Shards) setNote(note string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.note = note
}

// reshard runs the reshard loop when Next, on what the database shows, asks
// for anything but streaming the configured shards; it then makes sure the
// shards' publications exist. With postgres.shards: 1 a failure to observe
// is left to the start-up checks, which explain it.
func (s *Shards) reshard(ctx context.Context, strict bool) error {
	pc := s.cfg.Postgres
	n := pc.Shards
	if n <= 1 && !strict {
		if _, err := shard.Name(pc.Slot, 0, 1); err != nil {
			return nil // a slot name that reads as a shard's: never sharded
		}
		if _, err := shard.Name(pc.Publication, 0, 1); err != nil {
			return nil
		}
	}
	cctx := ctx
	if n <= 1 && !strict {
		// The start-up checks connect next and explain a failure; an
		// unreachable server must not make them wait twice as long.
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	conn, err := pg.Connect(cctx, pc)
	if err != nil {
		if n <= 1 && !strict {
			return nil
		}
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if n > 1 {
		major, version, err := pg.ServerMajor(ctx, conn)
		if err != nil {
			return err
		}
		if major < shard.MinVersion {
			return fmt.Errorf("postgres.shards is %d, and sharded slots need publication row filters, which came in Postgres %d; this server is %s: upgrade it, or set postgres.shards: 1",
				n, shard.MinVersion, version)
		}
	}
	per, err := s.cfg.PerTable()
	if err != nil {
		return err
	}
	reads := make([][]string, len(per))
	for i, t := range per {
		reads[i] = router.Columns(t.Router)
	}
	db := &reshard.PG{Conn: conn, Cfg: pc, Tables: config.ShardTablesOf(per), Reads: reads, Log: s.log}
	o, err := db.Observe(ctx)
	if err != nil {
		if n <= 1 && !strict {
			return nil
		}
		return err
	}
	a, err := shard.Next(shard.View{Slot: pc.Slot, Publication: pc.Publication, Want: n, Plan: o.Plan, Slots: o.Slots, Publications: o.Publications})
	if err != nil {
		return err
	}
	if a.Kind != shard.Stream && pc.Patterns() {
		// The reshard's publications would list only the tables named
		// exactly (config.Config.ShardTables), not those of patterns.
		return fmt.Errorf("the slots of %q in the database are not those of postgres.shards: %d, or a reshard is recorded, and resharding with a pattern in postgres.tables (%s) is not supported: "+
			"list the tables by name, reshard, then put the pattern back once the database holds a single shard (patterns take no postgres.shards above 1). "+
			"If the slots in the database are a single shard's (outboxd status lists them), set postgres.shards: 1 instead", pc.Slot, n, pc.EntryNames())
	}
	if a.Kind != shard.Stream {
		if err := s.lockedReshard(ctx, db); err != nil {
			return err
		}
	}
	if n > 1 {
		shards := make([]shard.Shard, len(s.streams))
		for i, r := range s.streams {
			shards[i] = r.shard
		}
		if err := db.EnsureShardPublications(ctx, shards); err != nil {
			return err
		}
	}
	return nil
}

// Reshard runs the reshard loop to postgres.shards, as Start does, and
// returns once the database holds that layout (the shards' publications
// made), without streaming: outboxd reshard. The old shards' pipelines
// drain while it runs.
func (s *Shards) Reshard(ctx context.Context) error {
	defer s.setNote("")
	return s.reshard(ctx, true)
}

// lockedReshard runs the reshard loop under the session advisory lock,
// waiting while another instance holds it.
func (s *Shards) lockedReshard(ctx context.Context, db *reshard.PG) error {
	pc := s.cfg.Postgres
	for {
		ok, err := db.Lock(ctx)
		if err != nil {
			return err
		}
		if ok {
			break
		}
		s.setNote("another outboxd is resharding slot " + pc.Slot + "; waiting for it")
		if !pause.For(ctx, pc.StandbyPollInterval) {
			return ctx.Err()
		}
	}
	s.log.Info("the slots in the database are not those of postgres.shards, or a reshard is recorded: resharding", "slot", pc.Slot, "shards", pc.Shards)
	rc := reshard.Config{Slot: pc.Slot, Publication: pc.Publication, Want: pc.Shards,
		Poll: max(pc.StandbyPollInterval, time.Second), Progress: s.setNote}
	if s.cfg.Kafka.ExactlyOnce() {
		rc.Delivered = func(ctx context.Context, old []shard.Shard) (map[string]wal.LSN, error) {
			return s.delivered(ctx, db, old)
		}
	}
	_, w, err := reshard.Run(ctx, db, rc, func(ctx context.Context, shards []shard.Shard, w shard.Window) error {
		return s.drain(ctx, db, shards, w)
	}, s.log)
	if err == nil {
		// The new shards skip what ends at or before the cutover, for
		// this process's life: a crash of Postgres before its next
		// checkpoint may put their slots back before it (issue 32 item 6).
		for _, r := range s.streams {
			r.window = w
		}
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("resharding to %d shards: %w", pc.Shards, err)
	}
	if _, uerr := db.Conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`); uerr != nil && err == nil && ctx.Err() == nil {
		return fmt.Errorf("releasing the reshard lock: %w", uerr)
	}
	return err
}

// drain runs the old shards with window w until each has delivered it.
// Their metrics go to a registry of their own, so that they leave no
// series behind once the reshard is over.
func (s *Shards) drain(ctx context.Context, db *reshard.PG, shards []shard.Shard, w shard.Window) error {
	if len(shards) > 0 && shards[0].Count > 1 {
		if err := db.EnsureShardPublications(ctx, shards); err != nil {
			return err
		}
	}
	var olds []*oldShard
	for _, sh := range shards {
		s.mu.Lock()
		old := s.draining[sh.Slot]
		s.mu.Unlock()
		if old == nil {
			r, err := newShardRelay(s.cfg, s.log, prometheus.NewRegistry(), sh, w)
			if err != nil {
				return err
			}
			r.drain = true
			old = &oldShard{relay: r}
			s.mu.Lock()
			s.draining[sh.Slot] = old
			s.mu.Unlock()
		}
		old.relay.window = w
		olds = append(olds, old)
	}
	delivered := make([]bool, len(olds))
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, old := range olds {
			if delivered[i] {
				delete(s.draining, old.relay.cfg.Postgres.Slot)
			}
		}
	}()
	g, gctx := errgroup.WithContext(ctx)
	for i, old := range olds {
		r := old.relay
		g.Go(func() error {
			checked, err := r.check.Check(gctx, old.history)
			old.history = checked.History
			if err != nil {
				return fmt.Errorf("old shard %s: %w", r.cfg.Postgres.Slot, err)
			}
			ended, err := r.supervise(gctx, &checked, r.runOnce, realClock{})
			old.history, delivered[i] = ended.history, ended.windowDelivered
			if err != nil {
				return &reshard.PermanentError{Err: err} // Run returns only what a restart cannot fix
			}
			if !ended.windowDelivered && gctx.Err() == nil {
				return errors.New("an old shard stopped before the reshard's cutover")
			}
			return nil
		})
	}
	return g.Wait()
}

// delivered reads, in exactly-once mode, the position each old shard's
// transactional id committed in Kafka (delivery.Delivered).
func (s *Shards) delivered(ctx context.Context, db *reshard.PG, old []shard.Shard) (map[string]wal.LSN, error) {
	olds := make([]delivery.OldShard, len(old))
	for i, sh := range old {
		r, err := newShardRelay(s.cfg, s.log, prometheus.NewRegistry(), sh, shard.Window{})
		if err != nil {
			return nil, err
		}
		olds[i] = delivery.OldShard{Shard: sh, Config: r.cfg, Log: r.log, ReplicationAt: r.check.ReplicationAt,
			Producer: func(id string) (*sink.Producer, error) {
				return sink.NewTransactional(r.cfg.Kafka, r.sinkM, r.txnM, r.log, id)
			}}
	}
	return delivery.Delivered(ctx, db, s.cfg.Postgres, s.cfg.Kafka.PositionsTopic, olds)
}

// lazyConn returns a connection of the run's own, opened at its first use.
func (r *Relay) lazyConn() *pg.Lazy { return &pg.Lazy{PG: r.cfg.Postgres} }

// ReshardWaitError is a pipeline's reason not to stream the slot it took:
// a reshard is under way (shard.GateFor). The relay lets the slot go and
// looks again after postgres.standby_poll_interval, as a standby does.
type ReshardWaitError struct{ Reason string }

func (e *ReshardWaitError) Error() string { return e.Reason }

// reshardGate decides, once the run has taken its slot, whether it may
// stream it (shard.GateFor, on conn): it returns the cutover of a reshard
// under way for an old shard's slot (0: none), which ends the run's window,
// and a *ReshardWaitError when it must not stream now (issue 32 item 5).
// confirmed is the slot's confirmed position as the run started.
func (r *Relay) reshardGate(ctx context.Context, lc *pg.Lazy, confirmed wal.LSN) (upto wal.LSN, err error) {
	conn, err := lc.Get(ctx)
	if err != nil {
		return 0, err
	}
	base := r.cfg.Postgres.Slot
	if sh := r.shard; sh.Count > 1 {
		base = strings.TrimSuffix(base, fmt.Sprintf("_%dof%d", sh.Index, sh.Count))
	}
	pc := r.cfg.Postgres
	pc.Slot = base
	locked, plan, err := reshard.ReadGate(ctx, conn, pc)
	if err != nil {
		return 0, err
	}
	if r.drain {
		confirmed = 0 // the resharding instance's own drain ends at the cutover
	}
	g := shard.GateFor(base, r.cfg.Postgres.Slot, plan, locked, confirmed)
	if g.Wait != "" {
		return 0, &ReshardWaitError{Reason: g.Wait}
	}
	return g.Upto, nil
}
