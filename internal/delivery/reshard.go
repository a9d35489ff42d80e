package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/eos"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/internal/reshard"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// OldShard is what Delivered needs of an old shard of a reshard: its
// configuration (its slot and publication) and logger, a transactional
// producer of its own for an id (Producer), and replication connections
// to a server of postgres.dsn (ReplicationAt).
type OldShard struct {
	Shard         shard.Shard
	Config        config.Config
	Log           *slog.Logger
	Producer      func(id string) (*sink.Producer, error)
	ReplicationAt func(ctx context.Context, addr string) (*pgconn.PgConn, error)
}

// Delivered reads, in exactly-once mode, the position each old shard's
// transactional id committed in Kafka (reshard.Delivered), by slot. A
// killed instance may have committed Kafka transactions past its slot's
// confirmed position (the next exactly-once start would confirm them); a
// cutover before them would make the new shards, under their own ids,
// deliver them again. It reads as the exactly-once start does (Fence, then
// the committed position, then positionOnServer), fencing every old id
// before reading any position: Kafka settles the transactions a killed
// instance left open, which would otherwise hold the read of the shared
// positions partition back until they time out, and no instance of the old
// layout can commit past what is read. The old shards' drain then resumes
// from these positions. db is the reshard's connection; pc and topic are
// postgres and kafka.positions_topic.
func Delivered(ctx context.Context, db *reshard.PG, pc config.Postgres, topic string, old []OldShard) (map[string]wal.LSN, error) {
	addr := pg.Addr(db.Conn.PgConn().Conn()) // the server the reshard observes
	system, err := systemID(ctx, pc, addr)
	if err != nil {
		return nil, err
	}
	type oldID struct {
		old      OldShard
		producer *sink.Producer
		owner    eos.Owner
	}
	var fenced []oldID
	defer func() {
		for _, o := range fenced {
			o.producer.Close()
		}
	}()
	for _, sh := range old {
		producer, err := sh.Producer(TransactionalID(sh.Config, sh.Shard, system))
		if err != nil {
			return nil, err
		}
		o := oldID{old: sh, producer: producer, owner: PositionOwner(sh.Config, producer.TransactionalID(), system)}
		fenced = append(fenced, o)
		if err := Fence(ctx, producer, o.owner); err != nil {
			return nil, oldShardError(sh.Shard, topic, err)
		}
	}
	out := make(map[string]wal.LSN, len(old))
	for _, o := range fenced {
		lsn, err := o.old.deliveredPosition(ctx, db, o.producer, o.owner, addr)
		if err != nil {
			return nil, oldShardError(o.old.Shard, topic, err)
		}
		out[o.old.Shard.Slot] = lsn
	}
	return out, nil
}

// systemID reads the system identifier of the server at addr on a
// replication connection opened for it and closed at once.
func systemID(ctx context.Context, pc config.Postgres, addr string) (string, error) {
	repl, err := pg.ConnectReplicationAt(ctx, pc, addr)
	if err != nil {
		return "", err
	}
	defer repl.Close(context.WithoutCancel(ctx))
	sys, err := identify(ctx, repl)
	return sys.SystemID, err
}

// oldShardError names the old shard whose position could not be read; a
// refused position (another deployment's id) stops the reshard.
func oldShardError(sh shard.Shard, topic string, err error) error {
	err = fmt.Errorf("reading the position of old shard %s in %s: %w", sh.Slot, topic, err)
	var refused *eos.RefusedError
	if errors.As(err, &refused) {
		return &reshard.PermanentError{Err: err}
	}
	return err
}

// deliveredPosition returns, after Fence, the end of what the shard's
// transactional id committed to Kafka: the position's LSN, or, when the
// position says only part of a Postgres transaction's rows are in Kafka,
// that transaction's end (reshard.PG.TxnEnd), so that the old shard
// delivers the rest of it before the cutover. It is 0 without a position.
// A position the exactly-once start would refuse (another slot's or
// server's) is refused here too, and one from an earlier timeline is taken
// as that start takes it (positionOnServer, on the server at addr, the
// one the reshard observes).
func (o OldShard) deliveredPosition(ctx context.Context, db *reshard.PG, producer *sink.Producer, owner eos.Owner, addr string) (wal.LSN, error) {
	pos, found, err := ReadPosition(ctx, producer.ReadPosition, owner)
	if err != nil || !found {
		return 0, err
	}
	if pos, err = o.positionOnServer(ctx, pos, owner.System, addr); err != nil {
		return 0, err
	}
	lsn := pos.LSN
	if pos.Txn != 0 {
		end, ok, err := db.TxnEnd(ctx, o.Config.Postgres.Slot, o.Config.Postgres.Publication, pos.Txn)
		switch {
		case err != nil:
			return 0, err
		case ok:
			lsn = max(lsn, end)
		default:
			o.Log.Warn("exactly-once: the position in Kafka names a transaction split over Kafka transactions that the old shard's slot does not hold; "+
				"the cutover is taken at the position, and the new shards deliver that transaction's rows again",
				"split_txn", pos.Txn.String(), "split_rows", pos.Rows, "slot", o.Config.Postgres.Slot)
		}
	}
	o.Log.Info("exactly-once: the old shard's position committed in Kafka", "transactional_id", owner.ID,
		"lsn", pos.LSN.String(), "split_txn", pos.Txn.String(), "split_rows", pos.Rows, "delivered_to", lsn.String(), "slot", o.Config.Postgres.Slot)
	return lsn, nil
}

// positionOnServer returns pos as it applies to the server at addr now
// (eos.Resume), on a replication connection opened for it and closed at
// once. The timeline and WAL end are read after Init: the previous holder
// committed positions until Init fenced it. system is the old shards'
// system identifier: a connection that reaches another database is
// refused. addr is the server the reshard observes (pg.Addr): another
// writable host of postgres.dsn, an old primary of the same database,
// would give an earlier timeline.
func (o OldShard) positionOnServer(ctx context.Context, pos eos.Position, system, addr string) (eos.Position, error) {
	if pos.LSN == 0 {
		return pos, nil // nothing to judge
	}
	repl, err := o.ReplicationAt(ctx, addr)
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
	}}, o.Config.Kafka.PositionsTopic)
	if err != nil {
		return pos, err
	}
	WarnResumed(o.Log, o.Config.Postgres.Slot, pos, resumed)
	return resumed.Position, nil
}

func identify(ctx context.Context, repl *pgconn.PgConn) (pglogrepl.IdentifySystemResult, error) {
	sys, err := pglogrepl.IdentifySystem(ctx, repl)
	if err != nil {
		return sys, fmt.Errorf("identifying the server for the exactly-once position: %w", err)
	}
	return sys, nil
}
