package preflight

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
func (c *Checker) logFailover(ctx context.Context, conn *pgx.Conn, major int, slot wal.SlotInfo) {
	f, err := pg.ReadFailover(ctx, conn, c.cfg.Postgres, major, slot, true)
	if err != nil {
		c.log.Warn("cannot tell whether a standby could take over with the slot", "slot", c.cfg.Postgres.Slot, "err", err)
		return
	}
	for _, n := range f.Notes(c.cfg.Postgres.Slot) {
		level := slog.LevelInfo
		if n.Warn {
			level = slog.LevelWarn
		}
		c.log.Log(ctx, level, n.Text, "slot", c.cfg.Postgres.Slot, "failover", f.SlotFailover)
	}
}

// alterToFailover makes the existing slot a failover slot, as
// postgres.failover_slot asks, over a replication connection of its own.
func (c *Checker) alterToFailover(ctx context.Context) error {
	repl, err := c.ConnectReplication(ctx)
	if err != nil {
		return err
	}
	defer repl.Close(context.WithoutCancel(ctx))
	return wal.AlterSlotFailover(ctx, repl, c.cfg.Postgres.Slot)
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
func (c *Checker) refuseAfterPromotion(ctx context.Context, conn *pgx.Conn) error {
	pg := c.cfg.Postgres
	tli, err := wal.Timeline(ctx, conn)
	switch {
	case err != nil && !pg.CreateSlot, tli == 1:
		return nil
	case err != nil:
		return fmt.Errorf("replication slot %q does not exist, and outboxd cannot tell whether this server was promoted or restored since the slot was last used (%w), so it does not create it. "+
			"If no outboxd used %q on this server or the one it was promoted from, create it with %s and start outboxd",
			pg.Slot, err, pg.Slot, wal.CreateSlotSQL(pg.Slot, pg.FailoverSlot))
	}
	at := c.switchPoint(ctx, tli)
	return wal.Errorf(wal.ErrSlotMissing, "replication slot %q does not exist, and this server is on timeline %d: it was promoted from a standby%s or restored from a backup, which keeps only synchronised failover slots. "+
		"If outboxd used %q before, %s. Then create the slot with %s and start outboxd; it creates the slot itself only on timeline 1",
		pg.Slot, tli, at, pg.Slot, missingAfterPromotion(at, "its last confirmed position (its last outboxd_checkpoint_confirmed_lsn)"), wal.CreateSlotSQL(pg.Slot, pg.FailoverSlot))
}

// missingAfterPromotion says which events a slot lost in a promotion (at
// LSN at, " at LSN X" or "") leaves undelivered: every event committed on
// the promoted server since, until the slot is created again, which no slot
// decodes; and those committed before it after since (outboxd's last
// confirmed position), which only the old primary's slot still holds.
func missingAfterPromotion(at, since string) string {
	return fmt.Sprintf("every event committed on this server since the promotion%s, until the slot is created again, will never be delivered (no slot decodes it), "+
		"and neither will those committed before the promotion after %s: recover the first from the outbox table or the application, "+
		"the second from the old primary's slot if it can be started (fenced, out of postgres.dsn), or from the outbox table or the application", at, since)
}

// switchPoint returns " at LSN X" where timeline tli began, or "" when it
// cannot be read.
func (c *Checker) switchPoint(ctx context.Context, tli int) string {
	repl, err := c.ConnectReplication(ctx)
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
func (c *Checker) slotMissing(ctx context.Context, conn *pgx.Conn, h *History) error {
	pg := c.cfg.Postgres
	tli, err := wal.Timeline(ctx, conn)
	if err == nil && h.timeline > 0 && tli > h.timeline {
		return c.promoted(ctx, tli, h.lostWhy(), h)
	}
	what := "was dropped while outboxd used it"
	if err != nil || h.timeline <= 0 {
		what = "is missing: dropped while outboxd used it, or lost in a promotion that outboxd could not see (it could not read the timeline)"
	}
	return wal.Errorf(wal.ErrSlotMissing, "replication slot %q %s; events committed since its last confirmed position may never be delivered. "+
		"Find them in the outbox table or the application; then %s", pg.Slot, what, wal.RecreateRemedy(tli, pg.Slot, pg.FailoverSlot))
}

// lostWhy says why the slot did not survive the promotion.
func (h *History) lostWhy() string {
	switch {
	case h.major > 0 && h.major < wal.FailoverMajor:
		return fmt.Sprintf("Postgres %d has no failover slots", h.major)
	case h.slotFailover:
		return "its copy on the standby was not synchronised and persisted yet"
	}
	return "it was not a failover slot"
}

// promoted is the stop for a slot lost in a promotion to timeline tli:
// why says why the slot outboxd used is not there.
func (c *Checker) promoted(ctx context.Context, tli int, why string, h *History) error {
	pg := c.cfg.Postgres
	st := c.progress()
	// SentLSN and ConfirmedCommitTime are set together, as this process
	// confirms; ConfirmedLSN, the slot's position as Postgres applied it,
	// may be another run's and does not go with the commit time.
	since := "the last position outboxd confirmed"
	switch {
	case st.SentLSN != "":
		since = "LSN " + st.SentLSN
		if !st.CommitTime.IsZero() {
			since += " (the last confirmed transaction committed at " + st.CommitTime.UTC().Format(time.RFC3339Nano) + ")"
		}
	case st.ConfirmedLSN != "":
		since = "LSN " + st.ConfirmedLSN
	}
	at := c.switchPoint(ctx, tli)
	return wal.Errorf(wal.ErrSlotMissing, "replication slot %q is missing: the server is a standby promoted to timeline %d%s (outboxd last saw timeline %d), and %s. "+
		"So %s; then create the slot with %s and start outboxd",
		pg.Slot, tli, at, h.timeline, why, missingAfterPromotion(at, since), wal.CreateSlotSQL(pg.Slot, pg.FailoverSlot))
}

// SplitBrainError refuses a server that is writable on an older timeline
// than another server outboxd saw writable: an old primary running again
// after a standby was promoted. Its slot is the old one, and what is
// committed there now is on no other server. It is retried: once the old
// primary is fenced or out of postgres.dsn, the next run reaches the new one.
type SplitBrainError struct {
	Server   string // host:port of the refused server
	Timeline int    // its timeline
	Newer    string // host:port where outboxd saw the newer timeline, "" when not known
	Seen     int    // that timeline
	Standby  bool   // Newer is a host of postgres.standby_dsns
}

func (e *SplitBrainError) Error() string {
	where := ""
	switch {
	case e.Standby:
		where = " on " + e.Newer + " (a host of postgres.standby_dsns, a primary now)"
	case e.Newer != "":
		where = " on " + e.Newer
	}
	return fmt.Sprintf("split brain: %s is a primary on timeline %d, and outboxd saw a primary on timeline %d%s; %[1]s is the old primary, writable again after a standby was promoted, "+
		"so outboxd does not stream from it (its slot is the old one, and what is committed there now is on no other server). "+
		"Fence it (stop it, or rebuild it as a standby of the new primary) or take it out of postgres.dsn; outboxd then streams from the new primary",
		e.Server, e.Timeline, e.Seen, where)
}

// refuseOlderTimeline refuses server (host:port), on timeline tli of the
// cluster with system identifier system, when outboxd saw a later timeline
// of that cluster (SplitBrainError). Timelines of different clusters (a
// pg_upgrade starts again at 1) say nothing of each other; an unknown
// identifier ("") is taken for the same cluster.
func (h *History) refuseOlderTimeline(server, system string, tli int) error {
	if tli <= 0 || tli >= h.newest || !sameCluster(system, h.newestSystem) {
		return nil
	}
	return &SplitBrainError{Server: server, Timeline: tli, Newer: h.newestAt, Seen: h.newest}
}

// sameCluster reports whether two system identifiers may be of one
// cluster: equal, or one of them unknown.
func sameCluster(a, b string) bool { return a == "" || b == "" || a == b }

// sawTimeline records tli of cluster system, read on server, as the highest
// seen when it is, or when it is the first seen of another cluster (after a
// pg_upgrade, the old cluster's timelines no longer count).
func (h *History) sawTimeline(server, system string, tli int) {
	if tli > h.newest || !sameCluster(system, h.newestSystem) {
		h.newest, h.newestAt, h.newestSystem = tli, server, system
	}
	if h.newestSystem == "" {
		h.newestSystem = system
	}
}

// refuseNewerPrimary refuses server (host:port), on timeline tli of cluster
// system, when another host of postgres.dsn or postgres.standby_dsns is a
// primary of the same cluster on a later timeline (pg.Primaries): a fresh
// outboxd has seen no timeline yet, and the DSN's first writable host may
// be an old primary. A primary of another cluster is no split brain.
func refuseNewerPrimary(server, system string, tli int, others []pg.Primary) error {
	for _, o := range others {
		if tli > 0 && o.Timeline > tli && sameCluster(system, o.System) {
			return &SplitBrainError{Server: server, Timeline: tli, Newer: o.Addr, Seen: o.Timeline, Standby: o.Standby}
		}
	}
	return nil
}

// refuseSplitBrain refuses the server conn is connected to when it is on an
// older timeline than this process saw, or than another primary among
// others (pg.Primaries). A timeline it cannot read refuses nothing here:
// ensureSlot judges that.
func RefuseSplitBrain(ctx context.Context, conn *pgx.Conn, h *History, others []pg.Primary) error {
	tli, err := wal.Timeline(ctx, conn)
	if err != nil {
		return nil
	}
	system := pg.SystemID(ctx, conn)
	if err := h.refuseOlderTimeline(serverAddr(conn), system, tli); err != nil {
		return err
	}
	return refuseNewerPrimary(serverAddr(conn), system, tli, others)
}

// serverAddr names the server conn is connected to.
func serverAddr(conn *pgx.Conn) string {
	if c := conn.PgConn().Conn(); c != nil {
		return c.RemoteAddr().String()
	}
	return "the server"
}

// replacedWhy reports whether a slot found on a server whose timeline
// changed from saved to tli since outboxd last saw it can be the one outboxd
// used: only a synchronised failover copy (synced, Postgres 17 and later),
// no further than its owner confirmed (confirmed; 0 when unknown). Anything
// else was created after the promotion, and resuming from it would skip
// what the old slot had not confirmed. why is "" when the slot may be used.
//
// confirmed is what this process confirmed only while it was the slot's
// last holder on the old timeline (Relay.confirmed): a process that was a
// standby since has no bound, because the active instance confirmed past
// it, and the copy is judged by synced alone.
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
func (c *Checker) noteSlot(ctx context.Context, conn *pgx.Conn, info wal.SlotInfo, h *History) error {
	if h.major == 0 {
		var err error
		if h.major, _, err = pg.ServerMajor(ctx, conn); err != nil {
			return err
		}
	}
	tli, err := wal.Timeline(ctx, conn)
	system := pg.SystemID(ctx, conn)
	switch {
	case err != nil:
		if !h.timelineWarned {
			h.timelineWarned = true
			c.log.Warn("cannot read the server's timeline; keeping the one last seen, so a slot lost to a promotion may be reported as dropped", "slot", c.cfg.Postgres.Slot, "err", err)
		}
	case tli < h.timeline && sameCluster(system, h.timelineSystem):
		return h.refuseOlderTimeline(serverAddr(conn), system, tli)
	case tli < h.timeline:
		// Another cluster with the slot: a pg_upgrade (Postgres 17 and
		// later keep logical slots) starts again at timeline 1.
		c.log.Warn("the server is another database cluster than the one the slot was last used on (pg_upgrade?); using its slot",
			"slot", c.cfg.Postgres.Slot, "system_identifier", system, "was", h.timelineSystem, "timeline", tli, "was_timeline", h.timeline)
		h.timeline, h.timelineSystem = tli, system
		h.sawTimeline(serverAddr(conn), system, tli)
	case tli == h.timeline:
		h.sawSlot(info)
	default:
		if why := replacedWhy(h.timeline, tli, info, h.confirmed); why != "" {
			return c.promoted(ctx, tli, why, h)
		}
		h.timeline, h.timelineSystem = tli, system
		h.sawTimeline(serverAddr(conn), system, tli)
	}
	h.slotFailover = info.Failover
	return nil
}

// sawSlot drops the bound replacedWhy judges a synchronised copy by
// (Relay.confirmed) once the slot is seen held by another process or
// past what this process confirmed: another instance confirms it now, and
// its copy may lawfully be further than this process ever confirmed.
func (h *History) sawSlot(info wal.SlotInfo) {
	if info.Active || info.ConfirmedFlushLSN > h.confirmed {
		h.confirmed = 0
	}
}

// checkSlot is wal.CheckSlot with the remedy for an invalidated slot worded
// for this server's timeline.
func (c *Checker) checkSlot(ctx context.Context, conn *pgx.Conn, info wal.SlotInfo, db string) error {
	err := wal.CheckSlot(info, db, "")
	if errors.Is(err, wal.ErrSlotLost) {
		tli, _ := wal.Timeline(ctx, conn) // 0, unknown: the remedy that works on any timeline
		err = wal.CheckSlot(info, db, wal.RecreateRemedy(tli, c.cfg.Postgres.Slot, c.cfg.Postgres.FailoverSlot))
	}
	return err
}

// JudgeGone decides a server error whose SQLSTATE may mean that the slot or
// the publication is gone (42704 undefined_object: a dropped slot or
// publication; 55000 object_not_in_prerequisite_state: an invalidated slot,
// among other things) by reading pg_replication_slots afresh, never by the message, which is in the server's language
// (lc_messages): a missing slot becomes wal.ErrSlotMissing, an invalidated
// one wal.ErrSlotLost (both exit 3); 42704 with the slot in place is the
// publication, missing where the WAL is decoded (wal.ErrPublicationMissing).
// When the catalogue cannot be read, or 55000 comes with the slot valid,
// err is returned as it is, to be retried: the next run's inspection reads
// the slot again. The catalogue read is the one of the server at addr, where
// the error came from (any host of postgres.dsn when ""): another writable
// host would answer for a slot the run did not use.
func (c *Checker) JudgeGone(ctx context.Context, pgErr *pgconn.PgError, err error, addr string, h *History) error {
	if pgErr.Code != "42704" && pgErr.Code != "55000" {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	conn, cerr := pg.ConnectAt(ctx, c.cfg.Postgres, addr)
	if cerr != nil {
		return err
	}
	defer conn.Close(ctx)
	if refuseStandby(ctx, conn) != nil {
		return err
	}
	if tli, terr := wal.Timeline(ctx, conn); terr == nil && h.refuseOlderTimeline(serverAddr(conn), pg.SystemID(ctx, conn), tli) != nil {
		return err // an old primary: its catalogue says nothing of the slot outboxd used
	}
	info, ok, ierr := wal.InspectSlot(ctx, conn, c.cfg.Postgres.Slot)
	switch {
	case ierr != nil:
		return err
	case !ok:
		return fmt.Errorf("%w (the server said: %s)", c.slotMissing(ctx, conn, h), pgErr.Message)
	}
	var db string
	if conn.QueryRow(ctx, "SELECT current_database()").Scan(&db) == nil {
		if lost := c.checkSlot(ctx, conn, info, db); errors.Is(lost, wal.ErrSlotLost) {
			return lost
		}
	}
	var streamed *StreamError
	if pgErr.Code == "42704" && errors.As(err, &streamed) {
		// The slot is in place and the stream had started on it, so the
		// undefined object is the publication, at the point in the WAL
		// being decoded (Postgres 14-17 fail there; whether it exists
		// again now does not matter). A 42704 from elsewhere (a slot
		// dropped before START_REPLICATION and created again since, a
		// catalogue lookup) is retried: the next run's inspection judges.
		return c.PublicationDropped(pgErr)
	}
	return err
}

// StreamError is an error the replication stream ended with, after
// START_REPLICATION succeeded: one the walsender raised while decoding.
type StreamError struct{ Err error }

func (e *StreamError) Error() string { return e.Err.Error() }
func (e *StreamError) Unwrap() error { return e.Err }
