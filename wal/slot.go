package wal

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/outboxd/outboxd/internal/quote"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Errors about the slot and publication that callers branch on with
// errors.Is. Each answers for itself (the Permanent and SlotGone methods):
// a restart cannot fix any of them, and the first two say that the slot is
// gone, which outboxd's command exits on with a status of its own.
var (
	// ErrSlotMissing: the slot does not exist and may not be created.
	ErrSlotMissing error = &kind{text: "replication slot does not exist", permanent: true, slotGone: true}
	// ErrSlotLost: Postgres invalidated the slot (wal_status = lost).
	ErrSlotLost error = &kind{text: "replication slot is invalidated", permanent: true, slotGone: true}
	// ErrPublicationMissing: the publication does not exist and may not be created.
	ErrPublicationMissing error = &kind{text: "publication does not exist", permanent: true}
)

// kind is a sentinel error that classifies itself: Permanent reports that
// a restart cannot fix what it says, SlotGone that the slot is missing or
// invalidated.
type kind struct {
	text                string
	permanent, slotGone bool
}

func (k *kind) Error() string   { return k.text }
func (k *kind) Permanent() bool { return k.permanent }
func (k *kind) SlotGone() bool  { return k.slotGone }

// Error is an error of a kind callers match with errors.Is (ErrSlotMissing,
// ErrSlotLost, ErrPublicationMissing, ...) that says what is wrong in its
// own words and carries what to do apart: outboxd's command prints the
// hint on a line of its own.
type Error struct {
	Kind   error  // the sentinel errors.Is matches, which classifies the error
	Msg    string // what is wrong, one line
	Remedy string // what to do, "" when the message says it
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

// Hint returns what to do.
func (e *Error) Hint() string { return e.Remedy }

// Errorf returns an error with the formatted text that errors.Is matches to
// sentinel.
func Errorf(sentinel error, format string, args ...any) error {
	return &Error{Kind: sentinel, Msg: fmt.Sprintf(format, args...)}
}

// SlotActiveError reports a slot held by another process.
type SlotActiveError struct {
	Slot string
	PID  int
}

func (e *SlotActiveError) Error() string {
	return fmt.Sprintf("replication slot %q is in use by process %d (another outboxd, or a leftover session); waiting for it to be released", e.Slot, e.PID)
}

// SlotInfo is a row of pg_replication_slots.
type SlotInfo struct {
	Name              string
	Plugin            string
	Database          string
	Active            bool
	ActivePID         int
	Temporary         bool
	WALStatus         string
	ConfirmedFlushLSN LSN
	// The columns of Postgres 17 and later: false and "" before.
	Failover           bool   // a failover slot, which standbys can synchronise
	Synced             bool   // a standby's copy of a failover slot (it stays true after a promotion)
	InvalidationReason string // why Postgres invalidated it, "" while it is valid
}

// slotColumns reads a row of pg_replication_slots; the columns that came in
// Postgres 17 are read through to_jsonb, which leaves them NULL on the
// versions that lack them.
const slotColumns = `slot_name, plugin, database, active, active_pid, temporary, wal_status, confirmed_flush_lsn::text,
	coalesce((to_jsonb(s) ->> 'failover')::bool, false), coalesce((to_jsonb(s) ->> 'synced')::bool, false),
	coalesce(to_jsonb(s) ->> 'invalidation_reason', '')
	FROM pg_replication_slots s`

// InspectSlot reads the slot's row; ok is false when there is none.
func InspectSlot(ctx context.Context, conn *pgx.Conn, name string) (info SlotInfo, ok bool, err error) {
	var pid *int32
	var plugin, db, walStatus *string
	var confirmed *string
	err = conn.QueryRow(ctx, `SELECT `+slotColumns+` WHERE slot_name = $1`, name).
		Scan(&info.Name, &plugin, &db, &info.Active, &pid, &info.Temporary, &walStatus, &confirmed,
			&info.Failover, &info.Synced, &info.InvalidationReason)
	if errors.Is(err, pgx.ErrNoRows) {
		return info, false, nil
	}
	if err != nil {
		return info, false, fmt.Errorf("reading replication slot %q: %w", name, err)
	}
	info.Plugin, info.Database, info.WALStatus = deref(plugin), deref(db), deref(walStatus)
	if pid != nil {
		info.ActivePID = int(*pid)
	}
	if confirmed != nil {
		if info.ConfirmedFlushLSN, err = ParseLSN(*confirmed); err != nil {
			return info, false, fmt.Errorf("reading replication slot %q: %w", name, err)
		}
	}
	return info, true, nil
}

// CheckSlot verifies that an existing slot can be streamed from by this
// database with pgoutput right now. recreate completes the remedy for an
// invalidated slot after "drop the slot and": how a new one is made on this
// server (RecreateRemedy).
func CheckSlot(info SlotInfo, database, recreate string) error {
	switch {
	case info.Plugin != "pgoutput":
		return fmt.Errorf("replication slot %q uses plugin %q; outboxd needs a pgoutput slot: drop it or configure another slot name", info.Name, info.Plugin)
	case info.Database != database:
		return fmt.Errorf("replication slot %q belongs to database %q, not %q; configure another slot name", info.Name, info.Database, database)
	case info.InvalidationReason != "" && info.InvalidationReason != "wal_removed":
		// Postgres 17 and later say why; wal_status is lost whatever the
		// reason, so the reason is read first.
		return &Error{Kind: ErrSlotLost,
			Msg: fmt.Sprintf("replication slot %q is invalidated (%s): Postgres can no longer decode it, so outbox events committed after its confirmed position %s may never be delivered",
				info.Name, info.InvalidationReason, info.ConfirmedFlushLSN),
			Remedy: dropLost(info.Name, recreate)}
	case info.WALStatus == "lost" || info.InvalidationReason == "wal_removed":
		return &Error{Kind: ErrSlotLost,
			Msg: fmt.Sprintf("replication slot %q is invalidated: Postgres removed WAL it still needed (max_slot_wal_keep_size), so outbox events committed while it lagged may never be delivered",
				info.Name),
			Remedy: dropLost(info.Name, recreate)}
	case info.Active:
		return &SlotActiveError{Slot: info.Name, PID: info.ActivePID}
	}
	return nil
}

// dropLost is the remedy for invalidated slot name; recreate completes it
// (RecreateRemedy).
func dropLost(name, recreate string) string {
	return fmt.Sprintf("recover the events from the outbox table or the application, then drop the slot (SELECT pg_drop_replication_slot('%s')) and %s", name, recreate)
}

// FailoverMajor is the first Postgres major version with failover slots.
const FailoverMajor = 17

// CreateSlotSQL is the statement that creates slot name as outboxd does,
// with failover (Postgres 17 and later) or without.
func CreateSlotSQL(name string, failover bool) string {
	if failover {
		return fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'pgoutput', false, false, true)", name)
	}
	return fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", name)
}

// RecreateRemedy says how a dropped slot is made again on a server on
// timeline tli (0: unknown): outboxd creates it only on timeline 1, and
// only when it is started again (it exits with a status that systemd's unit
// does not restart).
func RecreateRemedy(tli int, name string, failover bool) string {
	if tli == 1 {
		return "start outboxd again with postgres.create_slot: true, which creates a new one from the current position"
	}
	return fmt.Sprintf("create a new one with %s (outboxd creates it only on a server on timeline 1), then start outboxd", CreateSlotSQL(name, failover))
}

// CreateSlot creates a pgoutput logical replication slot, a failover slot
// if failover is set, and returns its starting position.
func CreateSlot(ctx context.Context, conn *pgx.Conn, name string, failover bool) (LSN, error) {
	sql := `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`
	if failover {
		sql = `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`
	}
	var lsn string
	if err := conn.QueryRow(ctx, sql, name).Scan(&lsn); err != nil {
		return 0, fmt.Errorf("creating replication slot %q: %w", name, err)
	}
	return ParseLSN(lsn)
}

// Exported is a slot created with its snapshot exported
// (CreateSlotExporting): the slot's consistent point and the name of the
// snapshot that sees exactly the transactions committed before it.
type Exported struct {
	LSN      LSN
	Snapshot string
}

// CreateSlotExporting creates a pgoutput logical replication slot on conn,
// a connection opened with replication=database, with
// CREATE_REPLICATION_SLOT ... EXPORT_SNAPSHOT. The snapshot lives until
// conn issues its next command or closes: the caller imports it first
// (SET TRANSACTION SNAPSHOT in a REPEATABLE READ transaction on another
// connection). The slot decodes exactly the transactions the snapshot does
// not see.
func CreateSlotExporting(ctx context.Context, conn *pgconn.PgConn, name string) (Exported, error) {
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, quote.Ident(name), "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
	if err != nil {
		return Exported{}, fmt.Errorf("creating replication slot %q with an exported snapshot: %w", name, err)
	}
	lsn, err := ParseLSN(res.ConsistentPoint)
	if err != nil {
		return Exported{}, fmt.Errorf("creating replication slot %q with an exported snapshot: %w", name, err)
	}
	if res.SnapshotName == "" {
		return Exported{}, fmt.Errorf("creating replication slot %q: the server exported no snapshot", name)
	}
	return Exported{LSN: lsn, Snapshot: res.SnapshotName}, nil
}

// AlterSlotFailoverSQL is the replication command that makes slot name a
// failover slot; it runs on a replication connection.
func AlterSlotFailoverSQL(name string) string {
	return fmt.Sprintf("ALTER_REPLICATION_SLOT %s ( FAILOVER true )", quote.Ident(name))
}

// AlterSlotFailover makes slot name a failover slot (Postgres 17 and later)
// on conn, a connection opened with replication=database. The slot must not
// be in use.
func AlterSlotFailover(ctx context.Context, conn *pgconn.PgConn, name string) error {
	if _, err := conn.Exec(ctx, AlterSlotFailoverSQL(name)).ReadAll(); err != nil {
		return fmt.Errorf("altering replication slot %q to failover: %w", name, err)
	}
	return nil
}

// ErrInRecovery: the server is a standby, in recovery, which has no
// timeline of its own and on which outboxd must not create its slot.
var ErrInRecovery = errors.New("the server is in recovery")

// Timeline returns the server's current timeline (1 until a standby of it
// was promoted, or it was restored from a backup), read from the name of
// the WAL file being written. On a server in recovery it returns an error
// that matches ErrInRecovery.
func Timeline(ctx context.Context, conn *pgx.Conn) (int, error) {
	var tli *int
	err := conn.QueryRow(ctx, `SELECT CASE WHEN NOT pg_is_in_recovery()
		THEN ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END`).Scan(&tli)
	switch {
	case err != nil:
		return 0, fmt.Errorf("reading the server's timeline: %w", err)
	case tli == nil:
		return 0, fmt.Errorf("reading the server's timeline: %w", ErrInRecovery)
	case *tli < 1:
		return 0, fmt.Errorf("reading the server's timeline: the WAL file name gives timeline %d", *tli)
	}
	return *tli, nil
}

// TimelineSwitch returns where the server's current timeline tli began (the
// position at which it was promoted or restored), read with TIMELINE_HISTORY
// on conn, a replication connection.
func TimelineSwitch(ctx context.Context, conn *pgconn.PgConn, tli int) (LSN, error) {
	res, err := pglogrepl.TimelineHistory(ctx, conn, int32(tli))
	if err != nil {
		return 0, fmt.Errorf("reading the history of timeline %d: %w", tli, err)
	}
	return parseTimelineHistory(res.Content)
}

// TimelineEnd returns where timeline old ended on the way to timeline
// current (its switch point in current's history), and false when current's
// history does not pass through old.
func TimelineEnd(ctx context.Context, conn *pgconn.PgConn, current, old int) (LSN, bool, error) {
	h, err := ReadHistory(ctx, conn, current)
	if err != nil {
		return 0, false, err
	}
	return h.End(old)
}

// History is a timeline's history file.
type History []byte

// ReadHistory reads the history of timeline tli (after the first) with
// TIMELINE_HISTORY on conn, a replication connection.
func ReadHistory(ctx context.Context, conn *pgconn.PgConn, tli int) (History, error) {
	res, err := pglogrepl.TimelineHistory(ctx, conn, int32(tli))
	if err != nil {
		return nil, fmt.Errorf("reading the history of timeline %d: %w", tli, err)
	}
	return res.Content, nil
}

// End returns where timeline old ended in the history (its switch point),
// and false when the history does not pass through old.
func (h History) End(old int) (LSN, bool, error) { return timelineEnd(h, old) }

// timelineEnd finds old's line ("parent-timeline<TAB>switch-LSN<TAB>reason")
// in a timeline history file.
func timelineEnd(content []byte, old int) (LSN, bool, error) {
	for _, line := range strings.Split(string(content), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || strings.HasPrefix(fields[0], "#") || fields[0] != strconv.Itoa(old) {
			continue
		}
		lsn, err := ParseLSN(fields[1])
		return lsn, err == nil, err
	}
	return 0, false, nil
}

// parseTimelineHistory returns the switch point of the history file's last
// line ("parent-timeline<TAB>switch-LSN<TAB>reason").
func parseTimelineHistory(content []byte) (LSN, error) {
	var last string
	for _, line := range strings.Split(string(content), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			last = line
		}
	}
	fields := strings.Fields(last)
	if len(fields) < 2 {
		return 0, fmt.Errorf("timeline history %q has no switch point", content)
	}
	return ParseLSN(fields[1])
}

// PublishActions are the changes outboxd's publication publishes: the
// inserts it delivers and the updates router.on_update reports. Deletes are
// left out: outboxd ignores them, and in an insert-then-delete outbox
// (migrations/0001_outbox.sql) every event has one, which Postgres would
// decode and send for nothing (BENCHMARKS.md, "Other defaults").
const PublishActions = "insert, update"

// Publication is what EnsurePublication found or made.
type Publication struct {
	Created bool // outboxd created it, publishing PublishActions
	// Deletes reports an existing publication that publishes DELETEs.
	Deletes bool
	// NoUpdates reports an existing publication that leaves UPDATEs out, so
	// that router.on_update never sees one.
	NoUpdates bool
	// Columns are the outbox columns it publishes (Postgres 15 and later;
	// nil before, when every column is published).
	Columns []string
}

// PublicationSQL is the statement that creates publication name for
// schema.table as outboxd does. publish_via_partition_root makes Postgres
// publish a partitioned table's rows under the table's own name; for other
// tables it changes nothing.
func PublicationSQL(name, schema, table string) string {
	return PublicationOfSQL(name, []Table{{Schema: schema, Name: table}})
}

// Table is a table by its schema and name, unquoted.
type Table struct{ Schema, Name string }

// String is schema.name, unquoted, for messages.
func (t Table) String() string { return t.Schema + "." + t.Name }

// PublicationOfSQL is PublicationSQL for several tables.
func PublicationOfSQL(name string, tables []Table) string {
	list := make([]string, len(tables))
	for i, t := range tables {
		list[i] = quote.Ident(t.Schema) + "." + quote.Ident(t.Name)
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = '%s', publish_via_partition_root = true)",
		quote.Ident(name), strings.Join(list, ", "), PublishActions)
}

// AlterPublicationSQL is the statement that makes an existing publication
// publish what outboxd's own does.
func AlterPublicationSQL(name string) string {
	return fmt.Sprintf("ALTER PUBLICATION %s SET (publish = '%s')", quote.Ident(name), PublishActions)
}

// EnsurePublication checks that the publication exists and covers table, and
// creates it with PublicationSQL when it is missing and create is true.
func EnsurePublication(ctx context.Context, conn *pgx.Conn, name, schema, table string, create bool) (Publication, error) {
	pubs, err := EnsurePublicationOf(ctx, conn, name, []Table{{Schema: schema, Name: table}}, create)
	if err != nil {
		return Publication{}, err
	}
	return pubs[0], nil
}

// EnsurePublicationOf is EnsurePublication for several tables: it returns
// what it found of each table, in the order of tables, and creates the
// publication of all of them (PublicationOfSQL) when it is missing.
func EnsurePublicationOf(ctx context.Context, conn *pgx.Conn, name string, tables []Table, create bool) ([]Publication, error) {
	var inserts, updates, deletes, viaRoot bool
	err := conn.QueryRow(ctx, `SELECT pubinsert, pubupdate, pubdelete, pubviaroot FROM pg_publication WHERE pubname = $1`, name).
		Scan(&inserts, &updates, &deletes, &viaRoot)
	missing := errors.Is(err, pgx.ErrNoRows)
	if err != nil && !missing {
		return nil, fmt.Errorf("reading publication %q: %w", name, err)
	}
	if missing {
		sql := PublicationOfSQL(name, tables)
		if !create {
			return nil, Errorf(ErrPublicationMissing, "publication %q does not exist; create it with %s, or set postgres.create_publication: true",
				name, sql)
		}
		if _, err := conn.Exec(ctx, sql); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42501" {
				return nil, fmt.Errorf("creating publication %q: %s; creating a publication needs ownership of the table and CREATE on the database: "+
					"run %s as the table's owner (migrations/roles/least_privilege.sql does), and set postgres.create_publication: false",
					name, pgErr.Message, sql)
			}
			return nil, fmt.Errorf("creating publication %q: %w", name, err)
		}
		pubs := make([]Publication, len(tables))
		for i := range pubs {
			pubs[i] = Publication{Created: true}
		}
		return pubs, nil
	}
	if !inserts {
		return nil, fmt.Errorf("publication %q does not publish INSERTs, so no event would reach outboxd; run %s", name, AlterPublicationSQL(name))
	}
	pubs := make([]Publication, len(tables))
	for i, t := range tables {
		columns, err := checkPublished(ctx, conn, name, t.Schema, t.Name, viaRoot)
		if err != nil {
			return nil, err
		}
		pubs[i] = Publication{Deletes: deletes, NoUpdates: !updates, Columns: columns}
	}
	return pubs, nil
}

// checkPublished checks that publication name publishes every row of
// schema.table under the table's name, and returns its column list.
func checkPublished(ctx context.Context, conn *pgx.Conn, name, schema, table string, viaRoot bool) ([]string, error) {
	// Without publish_via_partition_root, Postgres publishes a partition's
	// rows under the partition's name, and after the partition is dropped
	// nothing tells that they were the outbox's.
	var partitioned bool
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind = 'p')`, schema, table).Scan(&partitioned)
	if err != nil {
		return nil, fmt.Errorf("reading outbox table %s.%s: %w", schema, table, err)
	}
	if partitioned && !viaRoot {
		return nil, fmt.Errorf("the outbox table %s.%s is partitioned, and publication %q publishes its rows under each partition's name; "+
			"run ALTER PUBLICATION %s SET (publish_via_partition_root = true). The rows it already put into the slot keep their partition's name: "+
			"outboxd delivers them, if the partition is neither dropped nor detached before outboxd has read them", schema, table, name, quote.Ident(name))
	}
	// The table's row in pg_publication_tables: none when the publication
	// does not cover it. Its Postgres 15 row filter, if any: rows a filter
	// leaves out are never decoded, and outboxd would confirm past them
	// undelivered (read through to_jsonb: older servers have no rowfilter
	// column).
	// Its Postgres 15 column list too (attnames, which names every column
	// when there is no list): a column left out never reaches outboxd.
	var filter *string
	var columns []string
	err = conn.QueryRow(ctx, `SELECT to_jsonb(pt) ->> 'rowfilter', coalesce(to_jsonb(pt) -> 'attnames', 'null')
		FROM pg_publication_tables pt WHERE pt.pubname = $1 AND pt.schemaname = $2 AND pt.tablename = $3`,
		name, schema, table).Scan(&filter, &columns)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("publication %q does not include %s.%s; run ALTER PUBLICATION %s ADD TABLE %s.%s. "+
			"Rows of it written before that statement are not published and never reach outboxd: send them with outboxd replay, "+
			"and let the application write the table only after the statement (docs/configuration.md, \"Adding a table\")",
			name, schema, table, quote.Ident(name), quote.Ident(schema), quote.Ident(table))
	}
	if err != nil {
		return nil, fmt.Errorf("reading tables of publication %q: %w", name, err)
	}
	if filter != nil {
		return nil, fmt.Errorf("publication %q publishes only the rows of %s.%s WHERE %s, and the events it leaves out would never be delivered; "+
			"add the table again without WHERE (ALTER PUBLICATION %[5]s DROP TABLE %[6]s.%[7]s; ALTER PUBLICATION %[5]s ADD TABLE %[6]s.%[7]s), "+
			"or give outboxd a publication of its own",
			name, schema, table, *filter, quote.Ident(name), quote.Ident(schema), quote.Ident(table))
	}
	return columns, nil
}

// ColumnListError is the error for a publication whose column list leaves
// out columns outboxd reads.
func ColumnListError(name, schema, table string, published, missing []string) error {
	return fmt.Errorf("publication %q publishes only the columns %s of %s.%s, and outboxd reads %s too; "+
		"add the table again without a column list (ALTER PUBLICATION %[6]s DROP TABLE %[7]s.%[8]s; ALTER PUBLICATION %[6]s ADD TABLE %[7]s.%[8]s), "+
		"or give outboxd a publication of its own",
		name, strings.Join(published, ", "), schema, table, strings.Join(missing, ", "), quote.Ident(name), quote.Ident(schema), quote.Ident(table))
}

// ParseLSN parses Postgres' text form of an LSN ("16/B374D848").
func ParseLSN(s string) (LSN, error) {
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return 0, fmt.Errorf("parsing LSN %q: %w", s, err)
	}
	return lsn, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
