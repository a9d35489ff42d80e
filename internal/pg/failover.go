package pg

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	// Timeline is the standby's timeline when it is not in recovery (a
	// primary now), 0 otherwise or when it does not tell.
	Timeline  int    `json:"timeline,omitempty"`
	SyncSlots bool   `json:"sync_replication_slots"`
	Exists    bool   `json:"exists"`
	Synced    bool   `json:"synced"`
	Temporary bool   `json:"temporary"`
	Confirmed string `json:"confirmed_flush_lsn,omitempty"`
	// Invalidation is the copy's invalidation_reason, "" while it is valid.
	Invalidation string `json:"invalidation_reason,omitempty"`
}

// ReadFailover reads the slot's failover state and the standbys on conn,
// a connection to the primary, and asks the standbys of pg.StandbyDSNs for
// their copy of the slot.
func ReadFailover(ctx context.Context, conn *pgx.Conn, pg config.Postgres, major int, slot wal.SlotInfo, exists bool) (Failover, error) {
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
	if !c.InRecovery {
		c.Timeline, _ = wal.Timeline(ctx, conn)
	}
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

// splitBrain reports a standby that is a primary on a later timeline than
// tli, the timeline of the server outboxd reached: that server is the old
// primary.
func (c SlotCopy) splitBrain(tli int) bool {
	return c.Err == "" && !c.InRecovery && tli > 0 && c.Timeline > tli
}

// Note is one line about the failover state, for the start-up log and
// outboxd status; Warn marks what the operator should fix.
type Note struct {
	Warn bool
	Text string
}

// Notes says what f means for the slot, most important first.
func (f Failover) Notes(slot string) []Note {
	var out []Note
	add := func(warn bool, format string, args ...any) {
		out = append(out, Note{warn, fmt.Sprintf(format, args...)})
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
	for _, c := range f.Copies {
		if c.splitBrain(f.Timeline) {
			add(true, "split brain: standby %s is a primary on timeline %d, later than this server's %d: this server is the old primary; fence it (stop it, or rebuild it as a standby of %[1]s) and point postgres.dsn at %[1]s",
				c.Standby, c.Timeline, f.Timeline)
		}
	}
	if f.Major < wal.FailoverMajor || !f.SlotExists {
		return out
	}
	for _, c := range f.Copies {
		switch {
		case c.Err != "":
			add(true, "standby %s: cannot read its copy of the slot: %s", c.Standby, c.Err)
		case c.splitBrain(f.Timeline):
			// said above
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

// Primary is a server of postgres.dsn or postgres.standby_dsns that is
// writable (not in recovery), on Timeline.
type Primary struct {
	Addr     string // host:port
	Timeline int
	System   string // the system identifier of its cluster (SystemID), "" when unknown
	Standby  bool   // a host of postgres.standby_dsns
}

// host is one host of a DSN to ask, alone (pgHost.cfg has no other host).
type pgHost struct {
	cfg     *pgx.ConnConfig
	standby bool // a host of postgres.standby_dsns
}

// perHost splits cfg into one configuration per host, each asked on its
// own, with its attempts in the DSN's order (sslmode=prefer tries every
// host with TLS, then without) and without the DSN's target_session_attrs:
// a standby DSN's target_session_attrs=standby would leave out a standby
// promoted since, the very host to compare with.
func perHost(cfg *pgx.ConnConfig, standby bool) []pgHost {
	var all []pgHost
	byHost := map[string]*pgx.ConnConfig{}
	for _, f := range append([]*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...) {
		hp := net.JoinHostPort(f.Host, strconv.Itoa(int(f.Port)))
		if one := byHost[hp]; one != nil {
			one.Fallbacks = append(one.Fallbacks, f)
			continue
		}
		one := cfg.Copy()
		one.Host, one.Port, one.TLSConfig, one.Fallbacks = f.Host, f.Port, f.TLSConfig, nil
		one.ValidateConnect = nil // standbys too: Primaries skips them
		byHost[hp] = one
		all = append(all, pgHost{cfg: one, standby: standby})
	}
	return all
}

// Primaries asks every host of pg.DSN, each on its own, and of
// pg.StandbyDSNs whether it is a primary and on which timeline, all at once
// within timeout. Hosts that cannot be reached, are in recovery or do not
// tell their timeline are left out: this is for refusing a primary on an
// older timeline than another (split brain), and says nothing about the
// rest. With one host and no standby DSNs there is nothing to compare, and
// it returns nil without connecting.
func Primaries(ctx context.Context, pg config.Postgres, timeout time.Duration) []Primary {
	cfg, err := ConnConfig(pg)
	if err != nil {
		return nil
	}
	all := perHost(cfg, false)
	if len(all) == 1 && len(pg.StandbyDSNs) == 0 {
		return nil
	}
	for _, dsn := range pg.StandbyDSNs {
		if one, err := ConnConfig(config.Postgres{DSN: dsn, PasswordFile: pg.PasswordFile}); err == nil {
			all = append(all, perHost(one, true)...)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	found := make([]*Primary, len(all))
	var wg sync.WaitGroup
	for i, h := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.ConnectConfig(ctx, h.cfg)
			if err != nil {
				return
			}
			defer conn.Close(context.WithoutCancel(ctx))
			if tli, err := wal.Timeline(ctx, conn); err == nil {
				found[i] = &Primary{Addr: net.JoinHostPort(h.cfg.Host, strconv.Itoa(int(h.cfg.Port))), Timeline: tli,
					System: SystemID(ctx, conn), Standby: h.standby}
			}
		}()
	}
	wg.Wait()
	var out []Primary
	for _, p := range found {
		if p != nil {
			out = append(out, *p)
		}
	}
	return out
}
