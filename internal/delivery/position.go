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
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// Server is the run's server as its replication connection showed it in
// the connect stage (exactly-once only).
type Server struct {
	System string // the system identifier, in the transactional id and the positions
	Server eos.Server
}

// ReadServer reads, on the run's replication connection conn before
// START_REPLICATION, the server's system identifier (which the
// transactional id needs), and the timeline, WAL end and timeline history
// that the position read from Kafka is judged by, so that the Kafka side
// opens no connection to Postgres.
func ReadServer(ctx context.Context, conn *pgconn.PgConn) (Server, error) {
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return Server{}, fmt.Errorf("reading the system identifier for the exactly-once position: %w", err)
	}
	server := Server{System: sys.SystemID, Server: eos.Server{Timeline: int(sys.Timeline), WALEnd: sys.XLogPos}}
	server.Server.End = timelineEnds(ctx, conn, server.Server.Timeline)
	return server, nil
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

// TransactionalID is the transactional id of shard sh's runs on the
// database with system identifier system.
func TransactionalID(cfg config.Config, sh shard.Shard, system string) string {
	id := cfg.Kafka.TransactionalID
	if id == "" {
		return fmt.Sprintf("outboxd-%s-%s", system, cfg.Postgres.Slot) // a shard's slot: its own id
	}
	if sh.Count > 1 {
		// Shards must never share a transactional id: they would fence
		// each other.
		id = fmt.Sprintf("%s-%dof%d", id, sh.Index, sh.Count)
	}
	return id
}

// PositionOwner names whose positions a run applies: its slot, on the
// database with system identifier system, under transactional id id.
func PositionOwner(cfg config.Config, id, system string) eos.Owner {
	return eos.Owner{Slot: cfg.Postgres.Slot, System: system, ID: id, Topic: cfg.Kafka.PositionsTopic}
}

// Fence peeks at the id's last position and initialises the producer,
// fencing the id's previous holder (Kafka aborts or completes the
// transaction it left open). A peek that fails (the positions partition
// cannot be read) fails before Init: fencing the id's holder unseen could
// fence another deployment that shares the id. Only a peeked position that
// is not outboxd's (another writer's open transaction, say) leaves the
// decision to the committed one.
func Fence(ctx context.Context, producer *sink.Producer, owner eos.Owner) error {
	if owner.System == "" {
		return errors.New("exactly-once: the system identifier was not read before the position (a bug)")
	}
	if err := producer.EnsurePositionsTopic(ctx); err != nil {
		return err
	}
	if _, _, err := ReadPosition(ctx, producer.PeekPosition, owner); err != nil {
		var foreign *eos.ForeignError
		if !errors.As(err, &foreign) {
			return fmt.Errorf("looking at the last position of %q before initialising the transactional producer: %w", owner.ID, err)
		}
	}
	return producer.Init(ctx)
}

// ReadPosition reads the owner's position with read (the producer's
// ReadPosition or PeekPosition) and judges it (eos.Read): found is false
// when there is none.
func ReadPosition(ctx context.Context, read func(context.Context) ([]byte, bool, error), owner eos.Owner) (pos eos.Position, found bool, err error) {
	value, ok, err := read(ctx)
	if err != nil || !ok {
		return eos.Position{}, false, err
	}
	return eos.Read(value, owner)
}

// WarnResumed tells what a promotion took from pos, read from Kafka for
// slot.
func WarnResumed(log *slog.Logger, slot string, pos eos.Position, resumed eos.Resumed) {
	if resumed.Moved {
		log.Warn("exactly-once: the position in Kafka lies past where this server's timeline began; the events between them are in Kafka "+
			"but were lost in the promotion, and delivery resumes from the switch point", "position", pos.LSN.String(), "position_timeline", pos.Timeline,
			"switch_lsn", resumed.Switch.String(), "timeline", resumed.Timeline, "slot", slot)
	}
	if resumed.Dropped {
		log.Warn("exactly-once: the position in Kafka names a transaction split over Kafka transactions that committed on the old timeline only, "+
			"at or after where this server's timeline began; its rows in Kafka are not on this server, and a transaction of this timeline "+
			"is delivered whole", "split_txn", pos.Txn.String(), "split_rows", pos.Rows, "switch_lsn", resumed.Switch.String(),
			"position_timeline", pos.Timeline, "timeline", resumed.Timeline, "slot", slot)
	}
}
