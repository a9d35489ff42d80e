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

	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/wal"
)

// checkFailoverVersion refuses postgres.failover_slot on a server that has
// no failover slots.
func checkFailoverVersion(major int, version string, failover bool) error {
	if failover && major < wal.FailoverMajor {
		return fmt.Errorf("postgres.failover_slot is true, but Postgres %s has no failover slots (they came in %d); set postgres.failover_slot: false, or upgrade Postgres",
			version, wal.FailoverMajor)
	}
	return nil
}

// logFailover logs the failover state at start-up: each note at Info, or
// at Warn for what the operator should fix. A failure to read it is logged
// too: it does not stop streaming.
func (r *Relay) logFailover(ctx context.Context, conn *pgx.Conn, major int, slot wal.SlotInfo) {
	f, err := pg.ReadFailover(ctx, conn, r.cfg.Postgres, major, slot, true)
	if err != nil {
		r.log.Warn("cannot tell whether a standby could take over with the slot", "slot", r.cfg.Postgres.Slot, "err", err)
		return
	}
	for _, n := range f.Notes(r.cfg.Postgres.Slot) {
		level := slog.LevelInfo
		if n.Warn {
			level = slog.LevelWarn
		}
		r.log.Log(ctx, level, n.Text, "slot", r.cfg.Postgres.Slot, "failover", f.SlotFailover)
	}
}

// alterToFailover makes the existing slot a failover slot, as
// postgres.failover_slot asks, over a replication connection of its own.
func (r *Relay) alterToFailover(ctx context.Context) error {
	repl, err := r.connectReplication(ctx)
	if err != nil {
		return err
	}
	defer repl.Close(context.WithoutCancel(ctx))
	return wal.AlterSlotFailover(ctx, repl, r.cfg.Postgres.Slot)
}

// refuseStandby refuses a server in recovery: a standby has no slot of
// its own to stream from, and a slot created there (Postgres 16 and later
// allow it) would begin where the standby is promoted, past everything the
// old primary committed since outboxd last confirmed. The error is not
// fatal: the pipeline retries, and a host list without
// target_session_attrs may reach the primary next time.
func refuseStandby(ctx context.Context, conn *pgx.Conn) error {
	var inRecovery bool
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil {
		return fmt.Errorf("reading pg_is_in_recovery(): %w", err)
	}
	if !inRecovery {
		return nil
	}
	addr := "the server"
	if c := conn.PgConn().Conn(); c != nil {
		addr = c.RemoteAddr().String()
	}
	return fmt.Errorf("connected to a standby (%s is in recovery); outboxd needs the primary: add target_session_attrs=read-write to postgres.dsn", addr)
}

// refuseAfterPromotion refuses to create the slot on a server whose
// timeline is not 1: it was promoted from a standby or restored from a
// backup, neither of which keeps a logical slot unless it is a synchronised
// failover slot, so the slot may have existed before and a new one would
// silently skip what the old one had not confirmed. It fails closed: a
// timeline it cannot read refuses too. With postgres.create_slot false it
// refuses only a known later timeline, with the promotion's message, and
// leaves the rest to the caller.
func (r *Relay) refuseAfterPromotion(ctx context.Context, conn *pgx.Conn) error {
	pg := r.cfg.Postgres
	tli, err := wal.Timeline(ctx, conn)
	switch {
	case err != nil && !pg.CreateSlot, tli == 1:
		return nil
	case err != nil:
		return fmt.Errorf("replication slot %q does not exist, and outboxd cannot tell whether this server was promoted or restored since the slot was last used (%w), so it does not create it. "+
			"If no outboxd used %q on this server or the one it was promoted from, create it with %s and start outboxd",
			pg.Slot, err, pg.Slot, wal.CreateSlotSQL(pg.Slot, pg.FailoverSlot))
	}
	return wal.Errorf(wal.ErrSlotMissing, "replication slot %q does not exist, and this server is on timeline %d: it was promoted from a standby%s or restored from a backup, which keeps only synchronised failover slots. "+
		"If outboxd used %q before, events committed after its last confirmed position (its last outboxd_checkpoint_confirmed_lsn) and before the promotion may be missing: "+
		"recover them from the old primary's slot, the outbox table or the application. Then create the slot with %s and start outboxd; it creates the slot itself only on timeline 1",
		pg.Slot, tli, r.switchPoint(ctx, tli), pg.Slot, wal.CreateSlotSQL(pg.Slot, pg.FailoverSlot))
}

// switchPoint returns " at LSN X" where timeline tli began, or "" when it
// cannot be read.
func (r *Relay) switchPoint(ctx context.Context, tli int) string {
	repl, err := r.connectReplication(ctx)
	if err != nil {
		return ""
	}
	defer repl.Close(context.WithoutCancel(ctx))
	at, err := wal.TimelineSwitch(ctx, repl, tli)
	if err != nil {
		return ""
	}
	return " at LSN " + at.String()
}

// slotMissing explains a slot that is gone when a pipeline starts: dropped
// by someone, or left behind by a promotion (the timeline changed since
// the last run).
func (r *Relay) slotMissing(ctx context.Context, conn *pgx.Conn) error {
	pg := r.cfg.Postgres
	tli, err := wal.Timeline(ctx, conn)
	if err == nil && r.timeline > 0 && tli != r.timeline {
		return r.promoted(ctx, tli, r.lostWhy())
	}
	what := "was dropped while outboxd used it"
	if err != nil || r.timeline <= 0 {
		what = "is missing: dropped while outboxd used it, or lost in a promotion that outboxd could not see (it could not read the timeline)"
	}
	return wal.Errorf(wal.ErrSlotMissing, "replication slot %q %s; events committed since its last confirmed position may never be delivered. "+
		"Find them in the outbox table or the application; then %s", pg.Slot, what, wal.RecreateRemedy(tli, pg.Slot, pg.FailoverSlot))
}

// lostWhy says why the slot did not survive the promotion.
func (r *Relay) lostWhy() string {
	switch {
	case r.major > 0 && r.major < wal.FailoverMajor:
		return fmt.Sprintf("Postgres %d has no failover slots", r.major)
	case r.slotFailover:
		return "its copy on the standby was not synchronised and persisted yet"
	}
	return "it was not a failover slot"
}

// promoted is the stop for a slot lost in a promotion to timeline tli:
// why says why the slot outboxd used is not there.
func (r *Relay) promoted(ctx context.Context, tli int, why string) error {
	pg := r.cfg.Postgres
	st := r.Status()
	// SentLSN and ConfirmedCommitTime are set together, as this process
	// confirms; ConfirmedLSN, the slot's position as Postgres applied it,
	// may be another run's and does not go with the commit time.
	since := "the last position outboxd confirmed"
	switch {
	case st.SentLSN != "":
		since = "LSN " + st.SentLSN
		if !st.ConfirmedCommitTime.IsZero() {
			since += " (the last confirmed transaction committed at " + st.ConfirmedCommitTime.UTC().Format(time.RFC3339Nano) + ")"
		}
	case st.ConfirmedLSN != "":
		since = "LSN " + st.ConfirmedLSN
	}
	return wal.Errorf(wal.ErrSlotMissing, "replication slot %q is missing: the server is a standby promoted to timeline %d%s (outboxd last saw timeline %d), and %s. "+
		"Events committed after %s and before the promotion may never be delivered: recover them from the old primary's slot if it can be started, or from the outbox table or the application; "+
		"then create the slot with %s and start outboxd",
		pg.Slot, tli, r.switchPoint(ctx, tli), r.timeline, why, since, wal.CreateSlotSQL(pg.Slot, pg.FailoverSlot))
}

// replacedWhy reports whether a slot found on a server whose timeline
// changed from saved to tli since outboxd last saw it can be the one outboxd
// used: only a synchronised failover copy (synced, Postgres 17 and later)
// no further than outboxd confirmed (confirmed; 0 when unknown). Anything
// else was created after the promotion, and resuming from it would skip
// what the old slot had not confirmed. why is "" when the slot may be used.
func replacedWhy(saved, tli int, info wal.SlotInfo, confirmed wal.LSN) string {
	switch {
	case saved <= 0 || tli == saved:
		return ""
	case !info.Synced:
		return fmt.Sprintf("the slot there now is not a synchronised copy of the one outboxd used: it was created after the promotion, at %s", info.ConfirmedFlushLSN)
	case confirmed != 0 && info.ConfirmedFlushLSN > confirmed:
		return fmt.Sprintf("the slot there now is at %s, past the last position outboxd confirmed (%s): it is not the copy of the one outboxd used", info.ConfirmedFlushLSN, confirmed)
	}
	return ""
}

// noteSlot records, at each pipeline start, what slotMissing needs to tell
// a promotion from a drop: the timeline and the slot's failover flag. With
// the slot present on a timeline other than the one outboxd last saw, it
// stops with the promotion's message unless the slot is the synchronised
// copy of the one outboxd used, no further than this process confirmed
// (replacedWhy). A timeline it cannot read keeps the one it saw last, with
// a warning the first time; it never saves an unknown one. It fails only
// when the connection does.
func (r *Relay) noteSlot(ctx context.Context, conn *pgx.Conn, info wal.SlotInfo) error {
	if r.major == 0 {
		var err error
		if r.major, _, err = pg.ServerMajor(ctx, conn); err != nil {
			return err
		}
	}
	tli, err := wal.Timeline(ctx, conn)
	if err != nil {
		if !r.timelineWarned {
			r.timelineWarned = true
			r.log.Warn("cannot read the server's timeline; keeping the one last seen, so a slot lost to a promotion may be reported as dropped", "slot", r.cfg.Postgres.Slot, "err", err)
		}
	} else if why := replacedWhy(r.timeline, tli, info, r.confirmed); why != "" {
		return r.promoted(ctx, tli, why)
	} else {
		r.timeline = tli
	}
	r.slotFailover = info.Failover
	return nil
}

// checkSlot is wal.CheckSlot with the remedy for an invalidated slot worded
// for this server's timeline.
func (r *Relay) checkSlot(ctx context.Context, conn *pgx.Conn, info wal.SlotInfo, db string) error {
	err := wal.CheckSlot(info, db, "")
	if errors.Is(err, wal.ErrSlotLost) {
		tli, _ := wal.Timeline(ctx, conn) // 0, unknown: the remedy that works on any timeline
		err = wal.CheckSlot(info, db, wal.RecreateRemedy(tli, r.cfg.Postgres.Slot, r.cfg.Postgres.FailoverSlot))
	}
	return err
}

// ExitSlotGone is outboxd's exit status when the slot is missing or
// invalidated (SlotGone). A restart does not bring the slot back, and on
// timeline 1 a restarted outboxd would create a new slot at the current
// position, past every event the old one had not confirmed: service
// managers must not restart on it (deploy/systemd/outboxd.service,
// RestartPreventExitStatus).
const ExitSlotGone = 3

// SlotGone reports an error saying that the slot is missing or invalidated:
// outboxd's own (wal.ErrSlotMissing, wal.ErrSlotLost) or the server's, when
// the slot went between the inspection and START_REPLICATION.
func SlotGone(err error) bool {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, wal.ErrSlotMissing), errors.Is(err, wal.ErrSlotLost):
		return true
	case errors.As(err, &pgErr):
		return (pgErr.Code == "42704" || pgErr.Code == "55000") && strings.Contains(pgErr.Message, "replication slot")
	}
	return false
}
