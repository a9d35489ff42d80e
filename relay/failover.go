package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/wal"
)

// Failover is what the primary and the standbys say about the slot's fate in
// a Postgres failover: whether the slot is a failover slot, which physical
// standbys stream, whether synchronized_standby_slots names their slots,
// and whether the standbys of postgres.standby_dsns hold a copy of it.
type Failover struct {
	Major int `json:"server_major"`
	// Timeline is the server's timeline: above 1 after a promotion or a
	// restore, where outboxd does not create a missing slot.
	Timeline     int  `json:"timeline"`
	SlotExists   bool `json:"-"`
	SlotFailover bool `json:"slot_failover"`
	// SynchronizedStandbySlots is the primary's synchronized_standby_slots
	// (Postgres 17 and later): the physical slots whose standbys must have
	// flushed WAL before a logical walsender sends it.
	SynchronizedStandbySlots []string   `json:"synchronized_standby_slots,omitempty"`
	Standbys                 []Standby  `json:"standbys"`
	Copies                   []SlotCopy `json:"standby_copies,omitempty"`
	UnusedSynchronized       []string   `json:"-"` // named in SynchronizedStandbySlots, no standby streams from it
	Confirmed                wal.LSN    `json:"-"` // the slot's confirmed position on the primary
}

// Standby is a physical standby streaming from the primary
// (pg_stat_replication).
type Standby struct {
	Name string `json:"application_name"`
	// Slot is the physical slot it streams through, "" when none.
	Slot string `json:"slot,omitempty"`
	// Synchronized: synchronized_standby_slots names Slot.
	Synchronized bool `json:"synchronized"`
}

// SlotCopy is what a standby of postgres.standby_dsns holds of the slot.
type SlotCopy struct {
	Standby    string `json:"standby"` // host:port
	Err        string `json:"error,omitempty"`
	InRecovery bool   `json:"in_recovery"`
	SyncSlots  bool   `json:"sync_replication_slots"`
	Exists     bool   `json:"exists"`
	Synced     bool   `json:"synced"`
	Temporary  bool   `json:"temporary"`
	Confirmed  string `json:"confirmed_flush_lsn,omitempty"`
	// Invalidation is the copy's invalidation_reason, "" while it is valid.
	Invalidation string `json:"invalidation_reason,omitempty"`
}

// serverMajor returns the server's major version and its version string.
func serverMajor(ctx context.Context, conn *pgx.Conn) (int, string, error) {
	var num int
	var version string
	err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('server_version')`).Scan(&num, &version)
	if err != nil {
		return 0, "", fmt.Errorf("reading the server version: %w", err)
	}
	return num / 10000, version, nil
}

// checkFailoverVersion refuses postgres.failover_slot on a server that has
// no failover slots.
func checkFailoverVersion(major int, version string, failover bool) error {
	if failover && major < wal.FailoverMajor {
		return fmt.Errorf("postgres.failover_slot is true, but Postgres %s has no failover slots (they came in %d); set postgres.failover_slot: false, or upgrade Postgres",
			version, wal.FailoverMajor)
	}
	return nil
}

// readFailover reads the slot's failover state and the standbys on conn,
// a connection to the primary, and asks the standbys of pg.StandbyDSNs for
// their copy of the slot.
func readFailover(ctx context.Context, conn *pgx.Conn, pg config.Postgres, major int, slot wal.SlotInfo, exists bool) (Failover, error) {
	f := Failover{Major: major, SlotExists: exists, SlotFailover: slot.Failover, Confirmed: slot.ConfirmedFlushLSN, Standbys: []Standby{}}
	f.Timeline, _ = wal.Timeline(ctx, conn) // 0, unknown, where the server does not tell
	var synchronized *string
	err := conn.QueryRow(ctx, `SELECT current_setting('synchronized_standby_slots', true)`).Scan(&synchronized)
	if err != nil {
		return f, fmt.Errorf("reading synchronized_standby_slots: %w", err)
	}
	if synchronized != nil {
		for _, s := range strings.Split(*synchronized, ",") {
			if s = strings.Trim(strings.TrimSpace(s), `"`); s != "" {
				f.SynchronizedStandbySlots = append(f.SynchronizedStandbySlots, s)
			}
		}
	}
	rows, err := conn.Query(ctx, `SELECT coalesce(r.application_name, ''), coalesce(s.slot_name::text, '')
		FROM pg_stat_replication r JOIN pg_stat_activity a ON a.pid = r.pid
		LEFT JOIN pg_replication_slots s ON s.active_pid = r.pid
		WHERE a.datid IS NULL ORDER BY 1, 2`)
	if err != nil {
		return f, fmt.Errorf("reading pg_stat_replication: %w", err)
	}
	// A walsender connected to no database is a physical standby's (or a
	// base backup's); logical ones, outboxd's own among them, have one.
	var sb Standby
	_, err = pgx.ForEachRow(rows, []any{&sb.Name, &sb.Slot}, func() error {
		sb.Synchronized = sb.Slot != "" && slices.Contains(f.SynchronizedStandbySlots, sb.Slot)
		f.Standbys = append(f.Standbys, sb)
		return nil
	})
	if err != nil {
		return f, fmt.Errorf("reading pg_stat_replication: %w", err)
	}
	for _, s := range f.SynchronizedStandbySlots {
		if !f.streams(s) {
			f.UnusedSynchronized = append(f.UnusedSynchronized, s)
		}
	}
	for _, dsn := range pg.StandbyDSNs {
		f.Copies = append(f.Copies, readCopy(ctx, config.Postgres{DSN: dsn, PasswordFile: pg.PasswordFile}, pg.Slot))
	}
	return f, nil
}

func (f Failover) streams(slot string) bool {
	for _, s := range f.Standbys {
		if s.Slot == slot {
			return true
		}
	}
	return false
}

// readCopy reads the standby's copy of slot; a failure is reported in the
// copy, not returned: an unreachable standby is part of the picture.
func readCopy(ctx context.Context, pg config.Postgres, slot string) SlotCopy {
	c := SlotCopy{Standby: standbyAddr(pg.DSN)}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := Connect(ctx, pg)
	if err != nil {
		c.Err = err.Error()
		return c
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var sync *string
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('sync_replication_slots', true)`).Scan(&c.InRecovery, &sync); err != nil {
		c.Err = err.Error()
		return c
	}
	c.SyncSlots = sync != nil && *sync == "on"
	info, ok, err := wal.InspectSlot(ctx, conn, slot)
	if err != nil {
		c.Err = err.Error()
		return c
	}
	if ok {
		c.Exists, c.Synced, c.Temporary, c.Invalidation = true, info.Synced, info.Temporary, info.InvalidationReason
		if info.ConfirmedFlushLSN != 0 {
			c.Confirmed = info.ConfirmedFlushLSN.String()
		}
	}
	return c
}

// standbyAddr names a standby by the host and port of its DSN, never by the
// DSN itself (it may hold a password).
func standbyAddr(dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "(invalid DSN)"
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
}

// Usable reports whether the copy would survive a promotion of its standby
// now: synchronised, persisted, with a confirmed position and valid.
func (c SlotCopy) Usable() bool {
	return c.Err == "" && c.InRecovery && c.Exists && c.Synced && !c.Temporary && c.Confirmed != "" && c.Invalidation == ""
}

// note is one line about the failover state, for the start-up log and
// outboxd status; warn marks what the operator should fix.
type note struct {
	warn bool
	text string
}

// notes says what f means for the slot, most important first.
func (f Failover) notes(slot string) []note {
	var out []note
	add := func(warn bool, format string, args ...any) {
		out = append(out, note{warn, fmt.Sprintf(format, args...)})
	}
	physical := len(f.Standbys) > 0 || len(f.Copies) > 0
	if !f.SlotExists && f.Timeline > 1 {
		add(true, "the slot does not exist and this server is on timeline %d (promoted from a standby or restored from a backup), where outboxd does not create it: see the failover procedure in docs/operations.md", f.Timeline)
	}
	switch {
	case f.Major < wal.FailoverMajor:
		if physical {
			add(false, "not a failover slot: Postgres %d has none (they came in %d), so a promoted standby has no copy of slot %q and outboxd stops there; see the failover procedure in docs/operations.md",
				f.Major, wal.FailoverMajor, slot)
		} else {
			add(false, "not a failover slot: Postgres %d has none (they came in %d)", f.Major, wal.FailoverMajor)
		}
	case !f.SlotExists:
	case f.SlotFailover:
		add(false, "failover slot: standbys with sync_replication_slots = on keep a copy of it")
	case physical:
		add(true, "not a failover slot: a promoted standby has no copy of slot %q and outboxd stops there; set postgres.failover_slot: true (outboxd then alters the slot)", slot)
	default:
		add(false, "not a failover slot (postgres.failover_slot: false)")
	}
	failover := f.Major >= wal.FailoverMajor && f.SlotFailover
	for _, s := range f.Standbys {
		switch {
		case s.Slot == "":
			add(failover, "standby %s streams without a replication slot, so it cannot keep a copy of failover slots; give it one (primary_slot_name)", s.Name)
		case !failover:
			add(false, "standby %s streams through slot %s", s.Name, s.Slot)
		case s.Synchronized:
			add(false, "standby %s streams through slot %s, which synchronized_standby_slots names: outboxd receives only changes it has flushed", s.Name, s.Slot)
		default:
			add(true, "synchronized_standby_slots does not name standby %s's slot %s, so the standby can be promoted with a copy behind what outboxd confirmed, or without changes outboxd already delivered; "+
				"run ALTER SYSTEM SET synchronized_standby_slots = '%s'; SELECT pg_reload_conf() on the primary", s.Name, s.Slot, strings.Join(append(f.SynchronizedStandbySlots, s.Slot), ", "))
		}
	}
	for _, s := range f.UnusedSynchronized {
		add(true, "synchronized_standby_slots names %s, which no standby streams from: Postgres holds back outboxd's changes until it does; start the standby, or remove %s from synchronized_standby_slots", s, s)
	}
	if f.Major < wal.FailoverMajor || !f.SlotExists {
		return out
	}
	for _, c := range f.Copies {
		switch {
		case c.Err != "":
			add(true, "standby %s: cannot read its copy of the slot: %s", c.Standby, c.Err)
		case !c.InRecovery:
			add(true, "standby %s is not in recovery: it is a primary now, not a standby of this server", c.Standby)
		case !c.SyncSlots:
			add(failover, "standby %s has sync_replication_slots off, so it keeps no copy of failover slots; set it on (with hot_standby_feedback = on and a dbname in primary_conninfo)", c.Standby)
		case !c.Exists:
			add(failover, "standby %s holds no copy of slot %q yet: a promotion now would leave outboxd without a slot", c.Standby, slot)
		case c.Invalidation != "":
			add(true, "standby %s's copy of slot %q is invalidated (%s): a promotion now would leave outboxd without a usable slot", c.Standby, slot, c.Invalidation)
		case c.Temporary || c.Confirmed == "":
			add(true, "standby %s's copy of slot %q is not persisted yet (Postgres persists it once the slot has advanced past the standby's position): a promotion now would drop it", c.Standby, slot)
		default:
			add(false, "standby %s holds a synchronised copy of slot %q at %s (here %s)", c.Standby, slot, c.Confirmed, f.Confirmed)
		}
	}
	return out
}

// logFailover logs the failover state at start-up: each note at Info, or
// at Warn for what the operator should fix. A failure to read it is logged
// too: it does not stop streaming.
func (r *Relay) logFailover(ctx context.Context, conn *pgx.Conn, major int, slot wal.SlotInfo) {
	f, err := readFailover(ctx, conn, r.cfg.Postgres, major, slot, true)
	if err != nil {
		r.log.Warn("cannot tell whether a standby could take over with the slot", "slot", r.cfg.Postgres.Slot, "err", err)
		return
	}
	for _, n := range f.notes(r.cfg.Postgres.Slot) {
		level := slog.LevelInfo
		if n.warn {
			level = slog.LevelWarn
		}
		r.log.Log(ctx, level, n.text, "slot", r.cfg.Postgres.Slot, "failover", f.SlotFailover)
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
		if r.major, _, err = serverMajor(ctx, conn); err != nil {
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
