package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/internal/status"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/wal"
)

// Report is what `outboxd status` shows: the slot and publication as
// Postgres sees them, and the running outboxd's own status when reachable.
type Report struct {
	Slot        string   `json:"slot"`
	SlotExists  bool     `json:"slot_exists"`
	Plugin      string   `json:"plugin,omitempty"`
	Active      bool     `json:"active"`
	ActivePID   int      `json:"active_pid,omitempty"`
	Confirmed   string   `json:"confirmed_flush_lsn,omitempty"`
	LagBytes    int64    `json:"lag_bytes"`           // pg_current_wal_lsn() - confirmed_flush_lsn
	Retained    int64    `json:"retained_wal_bytes"`  // pg_current_wal_lsn() - restart_lsn
	FlushLag    string   `json:"flush_lag,omitempty"` // pg_stat_replication.flush_lag of the holder
	WALStatus   string   `json:"wal_status,omitempty"`
	SafeWALSize *int64   `json:"safe_wal_size_bytes,omitempty"`
	Publication string   `json:"publication"`
	PubTables   []string `json:"publication_tables"`
	// Table, TableRows and TableBytes are the outbox tables' names
	// (comma-separated), rows and bytes summed over them; Tables has each.
	Table      string         `json:"table"`
	TableRows  int64          `json:"table_rows_estimate"` // -1: not known, a table was never analysed
	TableBytes int64          `json:"table_bytes"`
	Tables     []TableSize    `json:"tables"`
	Process    *status.Status `json:"outboxd,omitempty"`
	ProcessURL string         `json:"outboxd_url"`
	ProcessErr string         `json:"outboxd_error,omitempty"`
	ReadAt     time.Time      `json:"read_at"`
	// ConfirmedAge is how long ago the last transaction the running outboxd
	// confirmed was committed, set only while it has records in flight: then
	// the oldest undelivered event is at most this old. With nothing in
	// flight it would only measure how long the outbox has been idle.
	ConfirmedAge *float64 `json:"last_confirmed_commit_age_seconds,omitempty"`
	// Failover is the slot's failover state and the physical standbys;
	// FailoverNotes says what it means, warnings marked "warning: ".
	Failover      *pg.Failover `json:"failover,omitempty"`
	FailoverNotes []string     `json:"failover_notes,omitempty"`
	// Shards is every shard's slot when postgres.shards is above 1, the
	// worst first: a missing slot, then the greatest lag. The slot and
	// publication fields above then describe the first of them, the worst
	// shard, so lag_bytes is the greatest lag of any shard.
	Shards []ShardSlot `json:"shards,omitempty"`
}

// ShardSlot is one shard's slot as Postgres sees it.
type ShardSlot struct {
	Index       int    `json:"index"` // i of <slot>_<i>of<N>
	Slot        string `json:"slot"`
	Publication string `json:"publication"`
	Exists      bool   `json:"exists"`
	Active      bool   `json:"active"`
	ActivePID   int    `json:"active_pid,omitempty"`
	Confirmed   string `json:"confirmed_flush_lsn,omitempty"`
	LagBytes    int64  `json:"lag_bytes"`
	Retained    int64  `json:"retained_wal_bytes"`
	WALStatus   string `json:"wal_status,omitempty"`
	SafeWALSize *int64 `json:"safe_wal_size_bytes,omitempty"`
	FlushLag    string `json:"flush_lag,omitempty"`
}

// BuildReport reads the report from Postgres and from the outboxd HTTP
// endpoint at statusURL ("" skips it).
func BuildReport(ctx context.Context, cfg config.Config, statusURL string) (Report, error) {
	rep := Report{Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication, Table: tableNames(cfg), ProcessURL: statusURL, ReadAt: time.Now()}
	conn, err := pg.Connect(ctx, cfg.Postgres)
	if err != nil {
		return rep, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if n := cfg.Postgres.Shards; n > 1 {
		if rep.Shards, err = readShards(ctx, conn, cfg.Postgres.Slot, cfg.Postgres.Publication, n); err != nil {
			return rep, err
		}
		rep.Slot, rep.Publication = rep.Shards[0].Slot, rep.Shards[0].Publication
	}
	info, ok, err := wal.InspectSlot(ctx, conn, rep.Slot)
	if err != nil {
		return rep, err
	}
	if ok {
		rep.SlotExists, rep.Plugin, rep.Active, rep.ActivePID, rep.WALStatus = true, info.Plugin, info.Active, info.ActivePID, info.WALStatus
		rep.Confirmed = info.ConfirmedFlushLSN.String()
		var flushLag *string
		err := conn.QueryRow(ctx, `SELECT coalesce((pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint, 0),
				coalesce((pg_current_wal_lsn() - s.restart_lsn)::bigint, 0), s.safe_wal_size,
				(SELECT r.flush_lag::text FROM pg_stat_replication r WHERE r.pid = s.active_pid)
			FROM pg_replication_slots s WHERE s.slot_name = $1`, rep.Slot).Scan(&rep.LagBytes, &rep.Retained, &rep.SafeWALSize, &flushLag)
		if err != nil {
			return rep, fmt.Errorf("reading slot lag: %w", err)
		}
		if flushLag != nil {
			rep.FlushLag = *flushLag
		}
	}
	major, _, err := pg.ServerMajor(ctx, conn)
	if err != nil {
		return rep, err
	}
	f, err := pg.ReadFailover(ctx, conn, cfg.Postgres, major, info, ok)
	if err != nil {
		return rep, err
	}
	rep.Failover = &f
	for _, n := range f.Notes(rep.Slot) {
		if n.Warn {
			n.Text = "warning: " + n.Text
		}
		rep.FailoverNotes = append(rep.FailoverNotes, n.Text)
	}
	rows, err := conn.Query(ctx, `SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1`, rep.Publication)
	if err != nil {
		return rep, fmt.Errorf("reading publication %q: %w", rep.Publication, err)
	}
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return rep, err
		}
		rep.PubTables = append(rep.PubTables, t)
	}
	if err := rows.Err(); err != nil {
		return rep, err
	}
	per, err := cfg.PerTable()
	if err != nil {
		return rep, err
	}
	for _, t := range per { // each table, and their sums
		schema, table := t.Postgres.TableName()
		ts := TableSize{Name: schema + "." + table}
		err := conn.QueryRow(ctx, `SELECT c.reltuples::bigint, pg_total_relation_size(c.oid) FROM pg_class c
			JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`, schema, table).Scan(&ts.Rows, &ts.Bytes)
		ts.Exists = err == nil
		rep.Tables = append(rep.Tables, ts)
		if ts.Rows < 0 || rep.TableRows < 0 {
			rep.TableRows = -1 // one was never analysed: the sum is not known
		} else {
			rep.TableRows += ts.Rows
		}
		rep.TableBytes += ts.Bytes
	}
	if statusURL != "" {
		st, err := fetchStatus(ctx, statusURL)
		if err != nil {
			rep.ProcessErr = err.Error()
		} else {
			rep.Process = &st
			rep.ConfirmedAge = confirmedAge(st, rep.ReadAt)
		}
	}
	return rep, nil
}

// readShards reads the slots of the n shards of slot (with the
// publications of publication), the worst first (sortShards).
func readShards(ctx context.Context, conn *pgx.Conn, slot, publication string, n int) ([]ShardSlot, error) {
	slots, err := shard.Names(slot, n)
	if err != nil {
		return nil, err
	}
	pubs, err := shard.Names(publication, n)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT n.i::int - 1, s.slot_name IS NOT NULL, coalesce(s.active, false), coalesce(s.active_pid, 0),
			coalesce(s.confirmed_flush_lsn::text, ''),
			coalesce((pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint, 0),
			coalesce((pg_current_wal_lsn() - s.restart_lsn)::bigint, 0),
			coalesce(s.wal_status, ''), s.safe_wal_size,
			coalesce((SELECT r.flush_lag::text FROM pg_stat_replication r WHERE r.pid = s.active_pid), '')
		FROM unnest($1::text[]) WITH ORDINALITY AS n(name, i)
		LEFT JOIN pg_replication_slots s ON s.slot_name = n.name ORDER BY n.i`, slots)
	if err != nil {
		return nil, fmt.Errorf("reading the slots of %d shards: %w", n, err)
	}
	var out []ShardSlot
	var sh ShardSlot
	_, err = pgx.ForEachRow(rows, []any{&sh.Index, &sh.Exists, &sh.Active, &sh.ActivePID, &sh.Confirmed, &sh.LagBytes, &sh.Retained,
		&sh.WALStatus, &sh.SafeWALSize, &sh.FlushLag}, func() error {
		sh.Slot, sh.Publication = slots[sh.Index], pubs[sh.Index]
		out = append(out, sh)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the slots of %d shards: %w", n, err)
	}
	sortShards(out)
	return out, nil
}

// sortShards puts the worst shard first: missing slots, then the greatest
// lag, then the lowest index.
func sortShards(s []ShardSlot) {
	slices.SortStableFunc(s, func(a, b ShardSlot) int {
		if a.Exists != b.Exists {
			if !a.Exists {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(b.LagBytes, a.LagBytes); c != 0 {
			return c
		}
		return cmp.Compare(a.Index, b.Index)
	})
}

// confirmedAge returns the age at now of the last confirmed commit while
// records are in flight, and nil otherwise.
func confirmedAge(st status.Status, now time.Time) *float64 {
	if st.InFlight == 0 || st.ConfirmedCommitTime.IsZero() {
		return nil
	}
	age := max(now.Sub(st.ConfirmedCommitTime).Seconds(), 0)
	return &age
}

func fetchStatus(ctx context.Context, url string) (status.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var st status.Status
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("outboxd is not reachable at %s: %w", url, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
		return st, fmt.Errorf("reading %s: %w", url, err)
	}
	return st, nil
}

// WriteText prints the report for a person, most important first.
func (rep Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	if !rep.SlotExists {
		row("slot", "%s does not exist (outboxd creates it at start-up when postgres.create_slot is true)", rep.Slot)
	} else {
		holder := "inactive: nothing is reading it, WAL accumulates"
		if rep.Active {
			holder = fmt.Sprintf("active, held by pid %d", rep.ActivePID)
		}
		row("slot", "%s (%s), %s", rep.Slot, rep.Plugin, holder)
		row("lag", "%s", rep.lagText())
		row("retained", "%s of WAL kept for the slot (since its restart_lsn)", bytesText(rep.Retained))
		row("confirmed", "%s", rep.Confirmed)
		wal := rep.WALStatus
		if wal != "reserved" {
			wal += " (not reserved: Postgres may remove WAL the slot needs)"
		}
		if rep.SafeWALSize != nil {
			wal += ", safe WAL size " + bytesText(*rep.SafeWALSize)
		}
		row("wal_status", "%s", wal)
	}
	if len(rep.Shards) > 0 {
		row("shards", "%d slots, the worst first (the slot above is the first)", len(rep.Shards))
		for _, sh := range rep.Shards {
			row("shard "+strconv.Itoa(sh.Index), "%s", sh.text())
		}
	}
	for _, n := range rep.FailoverNotes {
		row("failover", "%s", n)
	}
	pub := strings.Join(rep.PubTables, ", ")
	if pub == "" {
		pub = "(missing or empty)"
	}
	row("publication", "%s: %s", rep.Publication, pub)
	if len(rep.Tables) == 0 { // a report without the list: the sums
		row("outbox", "%s", TableSize{Name: rep.Table, Exists: true, Rows: rep.TableRows, Bytes: rep.TableBytes})
	}
	for _, t := range rep.Tables {
		row("outbox", "%s", t)
	}
	switch {
	case rep.Process != nil:
		p := rep.Process
		line := fmt.Sprintf("%s since %s, %d in flight", p.State, p.Since.Format(time.RFC3339), p.InFlight)
		if p.Reason != "" {
			line += " (" + p.Reason + ")"
		}
		row("outboxd", "%s", line)
		last := "none"
		if p.LastError != "" {
			last = fmt.Sprintf("%s (%s)", p.LastError, p.LastErrorTime.Format(time.RFC3339))
		}
		row("last error", "%s", last)
	case rep.ProcessErr != "":
		row("outboxd", "%s", rep.ProcessErr)
	}
	return tw.Flush()
}

// lagText is the report's lag line: the WAL written since the confirmed
// position, the age of the last confirmed commit while records are in
// flight, and the holder's flush lag.
func (rep Report) lagText() string {
	lag := bytesText(rep.LagBytes) + " of WAL since the confirmed position"
	if rep.ConfirmedAge != nil && rep.Process != nil {
		lag += fmt.Sprintf(", %d records in flight, last confirmed commit %s ago",
			rep.Process.InFlight, time.Duration(*rep.ConfirmedAge*float64(time.Second)).Round(time.Millisecond))
	}
	if rep.FlushLag != "" {
		lag += ", flush lag " + rep.FlushLag
	}
	return lag
}

// text is a shard's line: its slot, lag, confirmed position, holder and
// wal_status.
func (sh ShardSlot) text() string {
	if !sh.Exists {
		return sh.Slot + " does not exist"
	}
	line := fmt.Sprintf("%s: lag %s, confirmed %s, ", sh.Slot, bytesText(sh.LagBytes), sh.Confirmed)
	if sh.Active {
		line += fmt.Sprintf("active (pid %d)", sh.ActivePID)
	} else {
		line += "inactive"
	}
	line += ", wal_status " + sh.WALStatus
	if sh.FlushLag != "" {
		line += ", flush lag " + sh.FlushLag
	}
	return line
}

func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// TableSize is one outbox table's size, as Postgres estimates it.
type TableSize struct {
	Name   string `json:"name"`          // schema.table
	Exists bool   `json:"exists"`        // false: no such table, and the sizes are 0
	Rows   int64  `json:"rows_estimate"` // pg_class.reltuples; -1: not known, never analysed
	Bytes  int64  `json:"bytes"`         // pg_total_relation_size
}

// String is the table's line of the text report.
func (t TableSize) String() string {
	switch {
	case !t.Exists:
		return t.Name + ": does not exist"
	case t.Rows < 0:
		return fmt.Sprintf("%s: rows not known (never analysed), %s", t.Name, bytesText(t.Bytes))
	}
	return fmt.Sprintf("%s: ~%d rows, %s", t.Name, t.Rows, bytesText(t.Bytes))
}

// tableNames is postgres.table, or the names of postgres.tables,
// comma-separated.
func tableNames(cfg config.Config) string {
	if !cfg.Postgres.Several() {
		return cfg.Postgres.Table
	}
	names := make([]string, len(cfg.Postgres.Tables))
	for i, e := range cfg.Postgres.Tables {
		names[i] = e.Name
	}
	return strings.Join(names, ",")
}
