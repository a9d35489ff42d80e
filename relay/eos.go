package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/internal/delivery"
	"github.com/outboxd/outboxd/internal/eos"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// This file is kafka.delivery: exactly_once (DESIGN.md, "Exactly-once
// mode"): the I/O around package eos, which decides. The pipeline goroutine
// feeds an eos.Machine the stream and carries out its steps on the
// transactional producer and the tracker: each Postgres transaction holds
// one extra record in the tracker (a hold) from its Begin until the Kafka
// transaction holding its last record commits, so the ack rule confirms the
// slot only to committed positions.

// producerFor returns the pipeline's producer and, in exactly-once mode,
// the run's server as conn (the run's replication connection, before
// START_REPLICATION) shows it: a transactional producer, whose id needs
// the server's system identifier, and the timeline, WAL end and timeline
// history that the position read from Kafka is judged by (startEOS), so
// that the Kafka side opens no connection to Postgres. Nothing is fenced
// until Init. warm is what Check opened, for the first pipeline.
func (r *Relay) producerFor(ctx context.Context, conn *pgconn.PgConn, warm *Checked) (*sink.Producer, runServer, error) {
	if !r.cfg.Kafka.ExactlyOnce() {
		p, err := r.producer(warm)
		return p, runServer{}, err
	}
	if p := warm.TakeProducer(); p != nil { // Check warmed a plain client
		p.Close()
	}
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return nil, runServer{}, fmt.Errorf("reading the system identifier for the exactly-once position: %w", err)
	}
	server := runServer{system: sys.SystemID, server: eos.Server{Timeline: int(sys.Timeline), WALEnd: sys.XLogPos}}
	server.server.End = timelineEnds(ctx, conn, server.server.Timeline)
	id := r.transactionalID(sys.SystemID)
	r.txnID = id
	producer, err := sink.NewTransactional(r.cfg.Kafka, r.sinkM, r.txnM, r.log, id)
	return producer, server, err
}

// runServer is the run's server as its replication connection showed it
// in the connect stage (exactly-once only).
type runServer struct {
	system string // the system identifier, in the transactional id and the positions
	server eos.Server
}

// timelineEnds reads the history of timeline tli on conn, when there is
// one (after the first timeline), and returns a function that finds where
// an earlier timeline ended in it. A failure to read it is that function's
// to return: only a position written on an earlier timeline needs it.
func timelineEnds(ctx context.Context, conn *pgconn.PgConn, tli int) func(old int) (wal.LSN, bool, error) {
	if tli <= 1 {
		return func(int) (wal.LSN, bool, error) { return 0, false, nil }
	}
	history, err := wal.ReadHistory(ctx, conn, tli)
	return func(old int) (wal.LSN, bool, error) {
		if err != nil {
			return 0, false, err
		}
		return history.End(old)
	}
}

// transactionalID is the run's transactional id on the database with
// system identifier system.
func (r *Relay) transactionalID(system string) string {
	id := r.cfg.Kafka.TransactionalID
	if id == "" {
		return fmt.Sprintf("outboxd-%s-%s", system, r.cfg.Postgres.Slot) // a shard's slot: its own id
	}
	if r.shard.Count > 1 {
		// Shards must never share a transactional id: they would fence
		// each other.
		id = fmt.Sprintf("%s-%dof%d", id, r.shard.Index, r.shard.Count)
	}
	return id
}

// positionOwner names whose positions the run applies: its slot, on the
// database with system identifier system, under transactional id id.
func (r *Relay) positionOwner(id, system string) eos.Owner {
	return eos.Owner{Slot: r.cfg.Postgres.Slot, System: system, ID: id, Topic: r.cfg.Kafka.PositionsTopic}
}

// newExactlyOnce returns the driver of a run that resumes from resume on
// tracker (delivery.NewExactlyOnce).
func (r *Relay) newExactlyOnce(producer delivery.Transactions, tracker *checkpoint.Tracker, fail context.CancelCauseFunc, system string, timeline int, resume eos.Position) *exactlyOnce {
	return delivery.NewExactlyOnce(eos.New(eos.LimitsOf(r.cfg.Kafka), r.cfg.Postgres.Slot, system, timeline, resume, tracker.Confirmed()), producer, tracker, fail)
}

type exactlyOnce = delivery.ExactlyOnce

// startEOS initialises the transactional producer (fencing the previous
// holder of the id, whose open transaction Kafka aborts), reads the last
// committed position, applies it to the run's server (as the connect stage
// read it) and confirms it. Before it fences anyone it looks at the id's
// last position, committed or not: when another deployment's id it is, it
// refuses without disturbing that deployment; when it cannot read it, the
// run fails before Init and the next one tries again. It opens no
// connection to Postgres.
func (r *Relay) startEOS(ctx context.Context, p *pipeline, producer *sink.Producer, server runServer) (*exactlyOnce, error) {
	owner := r.positionOwner(producer.TransactionalID(), server.system)
	if err := fence(ctx, producer, owner); err != nil {
		return nil, err
	}
	read, found, err := readPosition(ctx, producer.ReadPosition, owner)
	if err != nil {
		return nil, err
	}
	resumed, err := eos.Resume(read, server.server, r.cfg.Kafka.PositionsTopic)
	if err != nil {
		return nil, err
	}
	r.warnResumed(read, resumed)
	pos := resumed.Position
	r.txnM.SetPositionRead(uint64(pos.LSN))
	p.tracker.Idle(pos.LSN) // nothing is registered yet: confirms it when it is past the slot
	r.log.Info("exactly-once: resuming after the position committed in Kafka", "transactional_id", producer.TransactionalID(),
		"lsn", pos.LSN.String(), "split_txn", pos.Txn.String(), "split_rows", pos.Rows, "found", found, "slot", r.cfg.Postgres.Slot)
	return r.newExactlyOnce(producer, p.tracker, p.fail, server.system, p.timeline, pos), nil
}

// fence peeks at the id's last position and initialises the producer,
// fencing the id's previous holder (Kafka aborts or completes the
// transaction it left open). A peek that fails (the positions partition
// cannot be read) fails before Init: fencing the id's holder unseen could
// fence another deployment that shares the id. Only a peeked position that
// is not outboxd's (another writer's open transaction, say) leaves the
// decision to the committed one.
func fence(ctx context.Context, producer *sink.Producer, owner eos.Owner) error {
	if owner.System == "" {
		return errors.New("exactly-once: the system identifier was not read before the position (a bug)")
	}
	if err := producer.EnsurePositionsTopic(ctx); err != nil {
		return err
	}
	if _, _, err := readPosition(ctx, producer.PeekPosition, owner); err != nil {
		var foreign *eos.ForeignError
		if !errors.As(err, &foreign) {
			return fmt.Errorf("looking at the last position of %q before initialising the transactional producer: %w", owner.ID, err)
		}
	}
	return producer.Init(ctx)
}

// readPosition reads the owner's position with read (the producer's
// ReadPosition or PeekPosition) and judges it (eos.Read): found is false
// when there is none.
func readPosition(ctx context.Context, read func(context.Context) ([]byte, bool, error), owner eos.Owner) (pos eos.Position, found bool, err error) {
	value, ok, err := read(ctx)
	if err != nil || !ok {
		return eos.Position{}, false, err
	}
	return eos.Read(value, owner)
}

// positionOnServer returns pos as it applies to the server at addr now
// (eos.Resume), on a replication connection opened for it and closed at
// once: a reshard's reading of an old shard's position (deliveredPosition).
// The timeline and WAL end are read after Init: the previous holder
// committed positions until Init fenced it. system is the old shards'
// system identifier: a connection that reaches another database is
// refused. addr is the server the reshard observes (pg.Addr): another
// writable host of postgres.dsn, an old primary of the same database,
// would give an earlier timeline.
func (r *Relay) positionOnServer(ctx context.Context, pos eos.Position, system, addr string) (eos.Position, error) {
	if pos.LSN == 0 {
		return pos, nil // nothing to judge
	}
	repl, err := r.check.ReplicationAt(ctx, addr)
	if err != nil {
		return pos, err
	}
	defer repl.Close(context.WithoutCancel(ctx))
	sys, err := identify(ctx, repl)
	if err != nil {
		return pos, err
	}
	if sys.SystemID != system {
		return pos, fmt.Errorf("the connection for the exactly-once position reached the database with system identifier %s, and the run streams from %s: "+
			"postgres.dsn names servers of different databases; give it the hosts of one primary and its standbys", sys.SystemID, system)
	}
	tli := int(sys.Timeline)
	resumed, err := eos.Resume(pos, eos.Server{Timeline: tli, WALEnd: sys.XLogPos, End: func(old int) (wal.LSN, bool, error) {
		return wal.TimelineEnd(ctx, repl, tli, old)
	}}, r.cfg.Kafka.PositionsTopic)
	if err != nil {
		return pos, err
	}
	r.warnResumed(pos, resumed)
	return resumed.Position, nil
}

func identify(ctx context.Context, repl *pgconn.PgConn) (pglogrepl.IdentifySystemResult, error) {
	sys, err := pglogrepl.IdentifySystem(ctx, repl)
	if err != nil {
		return sys, fmt.Errorf("identifying the server for the exactly-once position: %w", err)
	}
	return sys, nil
}

// warnResumed tells what a promotion took from pos, read from Kafka.
func (r *Relay) warnResumed(pos eos.Position, resumed eos.Resumed) {
	if resumed.Moved {
		r.log.Warn("exactly-once: the position in Kafka lies past where this server's timeline began; the events between them are in Kafka "+
			"but were lost in the promotion, and delivery resumes from the switch point", "position", pos.LSN.String(), "position_timeline", pos.Timeline,
			"switch_lsn", resumed.Switch.String(), "timeline", resumed.Timeline, "slot", r.cfg.Postgres.Slot)
	}
	if resumed.Dropped {
		r.log.Warn("exactly-once: the position in Kafka names a transaction split over Kafka transactions that committed on the old timeline only, "+
			"at or after where this server's timeline began; its rows in Kafka are not on this server, and a transaction of this timeline "+
			"is delivered whole", "split_txn", pos.Txn.String(), "split_rows", pos.Rows, "switch_lsn", resumed.Switch.String(),
			"position_timeline", pos.Timeline, "timeline", resumed.Timeline, "slot", r.cfg.Postgres.Slot)
	}
}

// pipeEOS is pipe in exactly-once mode: besides the batches it wakes up to
// commit a Kafka transaction that is due while nothing arrives.
func (r *Relay) pipeEOS(ctx context.Context, batches <-chan []wal.Item, p *pipeline, producer *sink.Producer, server runServer) (err error) {
	x, err := r.startEOS(ctx, p, producer, server)
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
			last := delivery.LastCommit(batch)
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
