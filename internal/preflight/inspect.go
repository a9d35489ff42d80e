package preflight

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/wal"
)

// History is what the checks and the pipeline starts learned of the slot
// and the servers it was seen on, to tell a promotion from a dropped slot
// (slotMissing) and an old primary from the new one (SplitBrainError). Its
// owner (the relay's supervisor) passes the same *History to every
// inspection of the slot, and the zero History is a fresh process's.
type History struct {
	// timeline is the timeline the slot was last used on (Timeline);
	// timelineSystem is the system identifier of its cluster, "" when
	// unknown.
	timeline       int
	timelineSystem string
	timelineWarned bool
	// newest is the highest timeline seen on any server (newestAt: where),
	// whether the slot was free or held there: a server on an older one is
	// refused (split brain). A standby instance of an HA pair records it at
	// each poll, before it ever holds the slot.
	newest       int
	newestAt     string
	newestSystem string // the system identifier of newest's cluster, "" when unknown
	major        int    // the server's major version, 0 until read
	slotFailover bool   // the slot was a failover slot when last inspected
	// confirmed is the highest position this process confirmed while no
	// other process held or advanced the slot since (0: unknown, as in a
	// standby instance): the bound for a synchronised copy after a
	// promotion (replacedWhy).
	confirmed wal.LSN
}

// Timeline is the timeline the slot was last used on, 0 when unknown.
func (h *History) Timeline() int { return h.timeline }

// Confirmed records that a run of this process confirmed up to lsn.
func (h *History) Confirmed(lsn wal.LSN) { h.confirmed = max(h.confirmed, lsn) }

// Slot is what a pipeline's inspection of the slot read.
type Slot struct {
	Confirmed wal.LSN // the slot's confirmed position: where the run starts
	// OutboxIDs are each outbox table's relation ID (0: no such table
	// now), in the order of config.Config.PerTable.
	OutboxIDs []uint32
	// Addr is the server the slot was read on (pg.Addr), where the run
	// streams from: every connection of the run that decides about its
	// events (catalogue lookups, the slot's position, the exactly-once
	// timeline) goes there and nowhere else.
	Addr string
	// Timeline is the server's timeline as the slot's history holds it
	// after the inspection (0: never read), which exactly-once positions
	// carry.
	Timeline int
}

// Primaries asks every host of postgres.dsn and postgres.standby_dsns,
// within 5 s, whether it is a primary and on which timeline (pg.Primaries;
// nothing to ask with one host): at every pipeline start but the first
// (Check asked) and at every takeover, a process that has not seen the
// newest timeline (a standby instance, or one restarted while the new
// primary was away) must not stream from an old primary.
func (c *Checker) Primaries(ctx context.Context) []pg.Primary {
	return pg.Primaries(ctx, c.cfg.Postgres, 5*time.Second)
}

// Inspect checks the slot before a run, on a connection of its own, which
// it returns open unless it fails.
func (c *Checker) Inspect(ctx context.Context, h *History) (Slot, *pgx.Conn, error) {
	conn, err := pg.Connect(ctx, c.cfg.Postgres)
	if err != nil {
		return Slot{}, nil, err
	}
	slot, err := c.InspectOn(ctx, conn, h)
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return Slot{}, nil, err
	}
	return slot, conn, nil
}

// InspectOn is Inspect on an open connection.
func (c *Checker) InspectOn(ctx context.Context, conn *pgx.Conn, h *History) (Slot, error) {
	if err := refuseStandby(ctx, conn); err != nil {
		return Slot{}, err
	}
	if tli, err := wal.Timeline(ctx, conn); err == nil {
		system := pg.SystemID(ctx, conn)
		if err := h.refuseOlderTimeline(serverAddr(conn), system, tli); err != nil {
			return Slot{}, err
		}
		h.sawTimeline(serverAddr(conn), system, tli) // also while another process holds the slot
	}
	if c.perErr != nil {
		return Slot{}, c.perErr
	}
	info, ok, err := wal.InspectSlot(ctx, conn, c.cfg.Postgres.Slot)
	if err != nil {
		return Slot{}, err
	}
	if info.Active {
		h.confirmed = 0 // another process holds the slot (History.confirmed)
	}
	if !ok {
		return Slot{}, c.slotMissing(ctx, conn, h)
	}
	// The outbox tables' relation IDs tell their rows after a rename.
	var db string
	names := make([]string, len(c.per))
	for i, t := range c.per {
		schema, table := t.Postgres.TableName()
		names[i] = pgx.Identifier{schema, table}.Sanitize()
	}
	var outboxIDs []uint32
	if err := conn.QueryRow(ctx, "SELECT current_database(), array(SELECT coalesce(to_regclass(n)::oid, 0) FROM unnest($1::text[]) WITH ORDINALITY AS u(n, i) ORDER BY i)", names).
		Scan(&db, &outboxIDs); err != nil {
		return Slot{}, fmt.Errorf("reading current database: %w", err)
	}
	if err := c.checkSlot(ctx, conn, info, db); err != nil {
		return Slot{}, err
	}
	if err := c.noteSlot(ctx, conn, info, h); err != nil {
		return Slot{}, err
	}
	return Slot{Confirmed: info.ConfirmedFlushLSN, OutboxIDs: outboxIDs, Addr: pg.Addr(conn.PgConn().Conn()), Timeline: h.timeline}, nil
}

// PublicationDropped is the stop for a publication dropped while outboxd
// used it (pgErr is what the server said).
func (c *Checker) PublicationDropped(pgErr *pgconn.PgError) error {
	pg := c.cfg.Postgres
	create := wal.PublicationOfSQL(pg.Publication, c.tables())
	if c.shard.Count > 1 {
		create = shard.PublicationSQL(pg.Publication, c.shardTables(), c.shard.Index, c.shard.Count)
	}
	return &wal.Error{Kind: wal.ErrPublicationMissing,
		Msg: fmt.Sprintf("publication %q was dropped while outboxd used it (%s): Postgres can no longer decode the slot, "+
			"so the events committed after the slot's confirmed position stay in the slot, undelivered but not confirmed",
			pg.Publication, pgErr.Message),
		Remedy: fmt.Sprintf("recreate the publication with %s and restart outboxd; transactions Postgres still cannot decode "+
			"must be recovered from the outbox table or the application before the slot is advanced past them", create)}
}

// Connect inspects the slot and opens the replication connection, on the
// connections of first (Check's, for the first pipeline; nil for the
// others) when there are any, which it takes; h is the slot's history. It
// opens both connections side by side, to start sooner, except in standby:
// there the slot is expected to be held, and a replication connection per
// poll would take a walsender place from the holder. standby, not nil while
// standing by, is the connection the polls share, which Connect closes on a
// takeover.
func (c *Checker) Connect(ctx context.Context, first *Checked, h *History, standby *pg.Lazy) (Slot, *pgconn.PgConn, error) {
	if first != nil && first.Conn != nil { // the first pipeline: Check's connections
		conn, repl := first.Conn, first.Repl
		first.Conn, first.Repl = nil, nil
		slot, err := c.InspectOn(ctx, conn, h)
		closed := conn.IsClosed() || (repl != nil && repl.IsClosed())
		if !closed && err == nil && repl == nil {
			repl, err = c.ReplicationBeside(ctx, conn)
		}
		conn.Close(context.WithoutCancel(ctx))
		if closed { // the server closed one while it waited: open new ones
			if repl != nil {
				repl.Close(context.Background())
			}
			return c.Connect(ctx, nil, h, standby)
		}
		if err != nil {
			if repl != nil {
				repl.Close(context.Background())
			}
			return Slot{}, nil, err
		}
		return slot, repl, nil
	}
	if standby != nil {
		// A standby polls on one connection, kept until it takes over
		// (or a poll fails), not one per poll.
		conn, err := standby.Get(ctx)
		if err != nil {
			return Slot{}, nil, err
		}
		slot, err := c.InspectOn(ctx, conn, h)
		var active *wal.SlotActiveError
		if errors.As(err, &active) {
			return Slot{}, nil, err
		}
		if err == nil { // a takeover
			err = RefuseSplitBrain(ctx, conn, h, c.Primaries(ctx))
		}
		var repl *pgconn.PgConn
		if err == nil {
			repl, err = c.ReplicationBeside(ctx, conn)
		}
		standby.Close()
		return slot, repl, err
	}
	type opened struct {
		conn *pgconn.PgConn
		err  error
	}
	repl := make(chan opened, 1)
	go func() {
		conn, err := c.ConnectReplication(ctx)
		repl <- opened{conn, err}
	}()
	others := make(chan []pg.Primary, 1)
	go func() { others <- c.Primaries(ctx) }()
	slot, conn, err := c.Inspect(ctx, h)
	if err == nil {
		if err = RefuseSplitBrain(ctx, conn, h, <-others); err != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}
	o := <-repl
	if err != nil {
		if o.conn != nil {
			o.conn.Close(context.Background())
		}
		return Slot{}, nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Opened side by side, the two may have reached different servers of
	// postgres.dsn (two writable hosts): the run streams from the one the
	// slot was read on, or not at all.
	if o.conn = BesideOrClose(conn, o.conn); o.conn == nil {
		o.conn, o.err = c.ReplicationBeside(ctx, conn)
	}
	if o.err != nil {
		return Slot{}, nil, o.err
	}
	return slot, o.conn, nil
}
