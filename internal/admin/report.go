package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/wal"
)

// Report is what `outboxd status` shows: the slot and publication as
// Postgres sees them, and the running outboxd's own status when reachable.
type Report struct {
	Slot        string        `json:"slot"`
	SlotExists  bool          `json:"slot_exists"`
	Plugin      string        `json:"plugin,omitempty"`
	Active      bool          `json:"active"`
	ActivePID   int           `json:"active_pid,omitempty"`
	Confirmed   string        `json:"confirmed_flush_lsn,omitempty"`
	LagBytes    int64         `json:"lag_bytes"`           // pg_current_wal_lsn() - confirmed_flush_lsn
	Retained    int64         `json:"retained_wal_bytes"`  // pg_current_wal_lsn() - restart_lsn
	FlushLag    string        `json:"flush_lag,omitempty"` // pg_stat_replication.flush_lag of the holder
	WALStatus   string        `json:"wal_status,omitempty"`
	SafeWALSize *int64        `json:"safe_wal_size_bytes,omitempty"`
	Publication string        `json:"publication"`
	PubTables   []string      `json:"publication_tables"`
	Table       string        `json:"table"`
	TableRows   int64         `json:"table_rows_estimate"` // -1: not known, the table was never analysed
	TableBytes  int64         `json:"table_bytes"`
	Process     *relay.Status `json:"outboxd,omitempty"`
	ProcessURL  string        `json:"outboxd_url"`
	ProcessErr  string        `json:"outboxd_error,omitempty"`
	ReadAt      time.Time     `json:"read_at"`
	// ConfirmedAge is how long ago the last transaction the running outboxd
	// confirmed was committed, set only while it has records in flight: then
	// the oldest undelivered event is at most this old. With nothing in
	// flight it would only measure how long the outbox has been idle.
	ConfirmedAge *float64 `json:"last_confirmed_commit_age_seconds,omitempty"`
	// Failover is the slot's failover state and the physical standbys;
	// FailoverNotes says what it means, warnings marked "warning: ".
	Failover      *pg.Failover `json:"failover,omitempty"`
	FailoverNotes []string     `json:"failover_notes,omitempty"`
}

// BuildReport reads the report from Postgres and from the outboxd HTTP
// endpoint at statusURL ("" skips it).
func BuildReport(ctx context.Context, cfg config.Config, statusURL string) (Report, error) {
	rep := Report{Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication, Table: cfg.Postgres.Table, ProcessURL: statusURL, ReadAt: time.Now()}
	conn, err := pg.Connect(ctx, cfg.Postgres)
	if err != nil {
		return rep, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	info, ok, err := wal.InspectSlot(ctx, conn, cfg.Postgres.Slot)
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
			FROM pg_replication_slots s WHERE s.slot_name = $1`, cfg.Postgres.Slot).Scan(&rep.LagBytes, &rep.Retained, &rep.SafeWALSize, &flushLag)
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
	for _, n := range f.Notes(cfg.Postgres.Slot) {
		if n.Warn {
			n.Text = "warning: " + n.Text
		}
		rep.FailoverNotes = append(rep.FailoverNotes, n.Text)
	}
	rows, err := conn.Query(ctx, `SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1`, cfg.Postgres.Publication)
	if err != nil {
		return rep, fmt.Errorf("reading publication %q: %w", cfg.Postgres.Publication, err)
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
	schema, table := cfg.Postgres.TableName()
	_ = conn.QueryRow(ctx, `SELECT c.reltuples::bigint, pg_total_relation_size(c.oid) FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`, schema, table).Scan(&rep.TableRows, &rep.TableBytes)
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

// confirmedAge returns the age at now of the last confirmed commit while
// records are in flight, and nil otherwise.
func confirmedAge(st relay.Status, now time.Time) *float64 {
	if st.InFlight == 0 || st.ConfirmedCommitTime.IsZero() {
		return nil
	}
	age := max(now.Sub(st.ConfirmedCommitTime).Seconds(), 0)
	return &age
}

func fetchStatus(ctx context.Context, url string) (relay.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var st relay.Status
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
	for _, n := range rep.FailoverNotes {
		row("failover", "%s", n)
	}
	pub := strings.Join(rep.PubTables, ", ")
	if pub == "" {
		pub = "(missing or empty)"
	}
	row("publication", "%s: %s", rep.Publication, pub)
	if rep.TableRows < 0 {
		row("outbox", "%s: rows not known (never analysed), %s", rep.Table, bytesText(rep.TableBytes))
	} else {
		row("outbox", "%s: ~%d rows, %s", rep.Table, rep.TableRows, bytesText(rep.TableBytes))
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
