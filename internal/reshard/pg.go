package reshard

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outboxd/internal/pause"
	"github.com/outboxd/outboxd/internal/pg"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/wal"
)

// PG is the DB on a Postgres connection of its own, for the outbox tables
// and settings of cfg.
type PG struct {
	Conn *pgx.Conn
	Cfg  config.Postgres
	// Tables are the outbox tables, each with its router.key_column, which
	// its row filter hashes (config.Config.ShardTables).
	Tables []shard.Table
	// Reads are the columns the router reads of each of Tables, at the
	// same index (router.Columns): a new shard's publication whose column
	// list leaves one out is refused before the cutover. Nil: not checked.
	Reads  [][]string
	Log    *slog.Logger
	probed bool
}

// lockKey is the key of the reshard loop's advisory lock, for slot $1.
const lockKey = `hashtext('outboxd reshard ' || $1)`

// Lock takes the session advisory lock of the slot's reshard loop, keyed by
// the configured slot name. It reports false when another session holds it.
func (p *PG) Lock(ctx context.Context) (bool, error) {
	var ok bool
	err := p.Conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+lockKey+`)`, p.Cfg.Slot).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("taking the reshard lock: %w", err)
	}
	return ok, nil
}

// ReadGate reads on conn what a pipeline that has just taken a slot needs
// to know (shard.GateFor): whether the reshard loop of the configured slot
// is running (its lock, tried in shared mode and let go at once), and the
// reshard recorded for it (nil: none), read while holding that lock when
// it could be taken.
func ReadGate(ctx context.Context, conn *pgx.Conn, cfg config.Postgres) (locked bool, plan *shard.Plan, err error) {
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock_shared(`+lockKey+`)`, cfg.Slot).Scan(&locked); err != nil {
		return false, nil, fmt.Errorf("trying the reshard lock: %w", err)
	}
	plan, err = readPlan(ctx, conn, cfg)
	if locked {
		if _, uerr := conn.Exec(ctx, `SELECT pg_advisory_unlock_shared(`+lockKey+`)`, cfg.Slot); uerr != nil && err == nil {
			err = fmt.Errorf("letting go of the reshard lock: %w", uerr)
		}
	}
	return locked, plan, err
}

func stateTable(cfg config.Postgres) string {
	return stateTableIn(stateSchema(cfg))
}

func stateTableIn(schema string) string {
	return pgx.Identifier{schema, "outboxd_reshard"}.Sanitize()
}

// otherSchemas are the schemas of the entries of postgres.tables named
// exactly but the state table's (stateSchema), each once.
func otherSchemas(cfg config.Postgres) []string {
	if cfg.Table != "" {
		return nil
	}
	seen := map[string]bool{stateSchema(cfg): true}
	var out []string
	for _, e := range cfg.Tables {
		schema, _ := e.Split()
		if e.Pattern() || seen[schema] {
			continue
		}
		seen[schema] = true
		out = append(out, schema)
	}
	return out
}

// stateSchema is the schema of the reshard state table: the outbox
// table's, or with several postgres.tables the first entry's (a reshard
// takes no pattern: relay.Shards refuses it). Every instance reads the
// same row only while the first entry stays the same.
func stateSchema(cfg config.Postgres) string {
	if cfg.Table == "" && len(cfg.Tables) > 0 {
		schema, _ := cfg.Tables[0].Split()
		return schema
	}
	schema, _ := cfg.TableName()
	return schema
}

func (p *PG) table() string { return stateTable(p.Cfg) }

// ReadPlan reads the reshard recorded for the configured (base) slot of
// cfg (nil: none), for a check that names the publications of both shard
// counts while one is.
func ReadPlan(ctx context.Context, conn *pgx.Conn, cfg config.Postgres) (*shard.Plan, error) {
	return readPlan(ctx, conn, cfg)
}

// readPlan reads the state table's row for the configured slot: nil when
// there is none, or no state table. A row for the slot in the state table
// of another entry's schema is refused: it is a reshard recorded while
// that entry was first in postgres.tables, and reading none here would
// take the reshard for none (review of issue 35 §1, S5).
func readPlan(ctx context.Context, conn *pgx.Conn, cfg config.Postgres) (*shard.Plan, error) {
	for _, schema := range otherSchemas(cfg) {
		pl, err := readPlanIn(ctx, conn, cfg, schema)
		if err != nil {
			return nil, err
		}
		if pl != nil {
			return nil, &PermanentError{fmt.Errorf("a reshard of slot %q from %d to %d shards (phase %s) is recorded in %s, but outboxd keeps the reshard state in the schema of the first entry of postgres.tables, %s: "+
				"postgres.tables was reordered while the reshard was in progress. Put an entry of schema %s first again until the reshard is done (outboxd status shows it), then reorder",
				cfg.Slot, pl.From, pl.To, pl.Phase, stateTableIn(schema), stateTable(cfg), pgx.Identifier{schema}.Sanitize())}
		}
	}
	return readPlanIn(ctx, conn, cfg, stateSchema(cfg))
}

// readPlanIn is readPlan of the state table in schema.
func readPlanIn(ctx context.Context, conn *pgx.Conn, cfg config.Postgres, schema string) (*shard.Plan, error) {
	table := stateTableIn(schema)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
		return nil, fmt.Errorf("reading the reshard state table: %w", err)
	}
	if !exists {
		return nil, nil
	}
	var pl shard.Plan
	var phase string
	var cutover *string
	err := conn.QueryRow(ctx, `SELECT from_shards, to_shards, phase, cutover::text FROM `+table+` WHERE slot = $1`, cfg.Slot).
		Scan(&pl.From, &pl.To, &phase, &cutover)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the reshard state table: %w", err)
	}
	pl.Phase = shard.Phase(phase)
	if cutover != nil {
		lsn, err := wal.ParseLSN(*cutover)
		if err != nil {
			return nil, err
		}
		pl.Cutover = lsn
	}
	return &pl, nil
}

// Observe reads the state table's row for the slot, the database's logical
// slots and the publications.
func (p *PG) Observe(ctx context.Context) (Observed, error) {
	var o Observed
	var err error
	if o.Plan, err = readPlan(ctx, p.Conn, p.Cfg); err != nil {
		return o, err
	}
	rows, err := p.Conn.Query(ctx, `SELECT slot_name::text, coalesce(confirmed_flush_lsn, '0/0')::text, active FROM pg_replication_slots
		WHERE slot_type = 'logical' AND database = current_database()`)
	if err != nil {
		return o, fmt.Errorf("reading the replication slots: %w", err)
	}
	var name, lsn string
	var active bool
	_, err = pgx.ForEachRow(rows, []any{&name, &lsn, &active}, func() error {
		l, err := wal.ParseLSN(lsn)
		o.Slots = append(o.Slots, shard.Slot{Name: name, Confirmed: l, Active: active})
		return err
	})
	if err != nil {
		return o, fmt.Errorf("reading the replication slots: %w", err)
	}
	rows, err = p.Conn.Query(ctx, `SELECT pubname::text FROM pg_publication`)
	if err != nil {
		return o, fmt.Errorf("reading the publications: %w", err)
	}
	_, err = pgx.ForEachRow(rows, []any{&name}, func() error {
		o.Publications = append(o.Publications, name)
		return nil
	})
	if err != nil {
		return o, fmt.Errorf("reading the publications: %w", err)
	}
	return o, nil
}

// Begin creates the state table and inserts the plan.
func (p *PG) Begin(ctx context.Context, pl shard.Plan) error {
	schema := stateSchema(p.Cfg)
	if _, err := p.Conn.Exec(ctx, shard.StateTableSQL(schema)); err != nil {
		return &PermanentError{fmt.Errorf("creating the reshard state table %s: %w; the role needs CREATE on schema %s, or create it with: %s",
			p.table(), err, schema, shard.StateTableSQL(schema))}
	}
	_, err := p.Conn.Exec(ctx, `INSERT INTO `+p.table()+` (slot, from_shards, to_shards, phase) VALUES ($1, $2, $3, $4) ON CONFLICT (slot) DO NOTHING`,
		p.Cfg.Slot, pl.From, pl.To, string(shard.Creating))
	if err != nil {
		return fmt.Errorf("recording the reshard: %w", err)
	}
	return nil
}

// CreatePublications creates the new shards' publications named that do
// not exist and checks each one that does, before the cutover: every
// outbox table listed, with its shard filter (one shard: listed, made as an
// unsharded outboxd makes it). fix says that a new shard's slot is still to
// be made after this call (Run): a publication put right now is right for
// every row after the cutover, which is taken at or past that slot's
// start. Then an existing publication that is wrong is put right when
// postgres.create_publication is true (a new shard's, not the configured
// one of a single shard, which may be the user's), and refused otherwise.
// Without fix every wrong one is refused, all in one error, each with the
// statement that puts it right, and an outbox table one lacks with the
// transaction that adds it to the publications of both shard counts
// (refuseMissing: the old shards' lack it too): Run takes the cutover past the end of
// every transaction open at the check's passing (CutoverLSN), so a fix by
// hand then loses nothing. Before all that, fix or not, an outbox table
// an old shard's publication lacks is refused the same way
// (checkOldPublications).
func (p *PG) CreatePublications(ctx context.Context, names []string, fix bool) error {
	if err := p.checkOldPublications(ctx); err != nil {
		return err
	}
	var refused []error
	first, lacking := "", []shard.Table(nil)
	for _, name := range names {
		missing, err := p.createPublication(ctx, name, fix)
		if len(missing) > 0 && first == "" {
			first, lacking = name, missing
		}
		var perm *PermanentError
		if !fix && errors.As(err, &perm) {
			// Every wrong one named at once: put right one per restart,
			// each would be found only at the next.
			refused = append(refused, perm.Err)
			continue
		}
		if err != nil {
			return err
		}
	}
	if first != "" {
		// The old shards' publications lack the tables too, and they
		// deliver every row up to the cutover: one transaction over the
		// publications of both counts, before the application writes
		// them (third review of issue 35 §1, M2).
		i, n, _ := shard.Parse(p.Cfg.Publication, first)
		err := p.refuseMissing(ctx, first, lacking, i, n)
		var perm *PermanentError
		if !errors.As(err, &perm) {
			return err
		}
		refused = append([]error{perm.Err}, refused...)
	}
	if len(refused) > 0 {
		return &PermanentError{errors.Join(refused...)}
	}
	return nil
}

// checkOldPublications refuses, before anything is made or put right, an
// outbox table that an existing publication of the old shards of the
// reshard recorded lacks, through refuseMissing over both shard counts:
// the old shards deliver every row up to the cutover, so adding it to the
// new shards' publications alone would leave its rows up to then to no
// shard, and the first word of it would come from the drain, after the
// cutover is recorded (fourth review of issue 35 §1, S1).
func (p *PG) checkOldPublications(ctx context.Context) error {
	plan, err := readPlan(ctx, p.Conn, p.Cfg)
	if err != nil || plan == nil {
		return err
	}
	pubs, err := p.existingPublications(ctx, plan.From) // a missing one: the old shards' own start refuses it
	if err != nil {
		return err
	}
	for _, pub := range pubs {
		missing, err := p.lacking(ctx, pub.Publication)
		if err != nil {
			return err
		}
		if len(missing) > 0 {
			return p.refuseMissing(ctx, pub.Publication, missing, pub.I, pub.N)
		}
	}
	return nil
}

// existingPublications returns the publications of count shards that
// exist, each with its shard (no tables).
func (p *PG) existingPublications(ctx context.Context, count int) ([]shard.Lack, error) {
	names, err := shard.Names(p.Cfg.Publication, count)
	if err != nil {
		return nil, &PermanentError{fmt.Errorf("postgres.publication: %w", err)}
	}
	var out []shard.Lack
	for i, name := range names {
		exists, err := p.publicationExists(ctx, name)
		if err != nil {
			return nil, err
		}
		if exists {
			out = append(out, shard.Lack{Publication: name, I: i, N: count})
		}
	}
	return out, nil
}

// createPublication is CreatePublications of the publication name. It
// returns the outbox tables an existing publication lacks, for
// CreatePublications to refuse, rather than refusing them: without fix
// for n > 1, always for n = 1 (whose publication outboxd never alters).
func (p *PG) createPublication(ctx context.Context, name string, fix bool) ([]shard.Table, error) {
	i, n, ok := shard.Parse(p.Cfg.Publication, name)
	if !ok {
		return nil, &PermanentError{fmt.Errorf("publication %q is not a shard of %q", name, p.Cfg.Publication)}
	}
	exists, err := p.publicationExists(ctx, name)
	if err != nil {
		return nil, err
	}
	switch {
	case !exists && !fix:
		// Made now, after the new shards' slots, it would publish
		// nothing committed between the two; pgoutput would fail on,
		// or pass over, the WAL before it (second review of issue 35
		// §1, S2: one shard too).
		return nil, &PermanentError{fmt.Errorf("publication %q of new shard %d of %d does not exist (dropped after the new shards' slots were made): made now, it would publish nothing written before it, so roll the reshard back rather than create it", name, i, n)}
	case n == 1:
		// A table the existing "outboxd" lacks is returned, not refused
		// with an ALTER of it alone: the old shards' publications lack it
		// too, and they deliver every row up to the cutover
		// (CreatePublications refuses it over both counts; fourth review
		// of issue 35 §1, M1).
		if exists {
			missing, err := p.lacking(ctx, name)
			if err != nil || len(missing) > 0 {
				return missing, err
			}
		}
		// Its own refusals (a missing publication with
		// create_publication false, a table it lacks) carry no
		// SQLSTATE: only a server error is judged by transient here.
		pubs, err := wal.EnsurePublicationOf(ctx, p.Conn, name, p.walTables(), p.Cfg.CreatePublication)
		if err != nil && sqlState(err) != "" && transient(err) {
			return nil, err
		} else if err != nil {
			return nil, &PermanentError{err}
		}
		for j, pub := range pubs {
			if pub.Columns == nil || j >= len(p.Reads) {
				continue
			}
			if left := pg.MissingColumns(pub.Columns, p.Reads[j]); len(left) > 0 {
				return nil, &PermanentError{wal.ColumnListError(name, p.Tables[j].Schema, p.Tables[j].Name, pub.Columns, left)}
			}
		}
		return nil, nil
	case !exists:
		return nil, p.createShardPublication(ctx, name, i, n)
	}
	return p.checkNewPublication(ctx, name, i, n, fix)
}

// lacking returns the outbox tables the existing publication name does
// not list. A partitioned one it publishes under its partitions' names
// (without publish_via_partition_root) is left to the check of its
// options, which refuses that first.
func (p *PG) lacking(ctx context.Context, name string) ([]shard.Table, error) {
	o, err := p.readOptions(ctx, name)
	if err != nil {
		return nil, err
	}
	listed, err := p.listedTables(ctx, name)
	if err != nil {
		return nil, err
	}
	var missing []shard.Table
	for _, t := range p.Tables {
		if !listed[shard.Table{Schema: t.Schema, Name: t.Name}] && !slices.Contains(o.roots, t) {
			missing = append(missing, t)
		}
	}
	return missing, nil
}

// CutoverLSN returns the position to record as the cutover once the
// publications' check has passed. A transaction open across a fix by hand
// of a new shard's publication has its rows from before the fix decoded
// by the new slot with the catalogue from before it (pgoutput reads the
// publication at each change, not at the commit), so no new shard
// delivers them: the cutover must lie past its commit, where the old
// shards deliver it whole (third review of issue 35 §1, M1). So it takes
// an xid, waits until every transaction that had one then (all that had
// written by the check) has ended, and then reads the WAL insert position,
// which is past every commit that has returned, even with
// synchronous_commit = off. The wait logs the oldest transaction it waits
// for every few seconds, and ends with ctx.
func (p *PG) CutoverLSN(ctx context.Context) (wal.LSN, error) {
	var xid string
	if err := p.Conn.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
		return 0, fmt.Errorf("taking an xid for the cutover: %w", err)
	}
	start, logged := time.Now(), time.Now()
	for {
		var ended bool
		if err := p.Conn.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot()) > $1::xid8`, xid).Scan(&ended); err != nil {
			return 0, fmt.Errorf("waiting for the transactions open at the cutover's check to end: %w", err)
		}
		if ended {
			break
		}
		if time.Since(logged) >= waitLogEvery {
			logged = time.Now()
			if err := p.logOldest(ctx, xid, time.Since(start)); err != nil {
				return 0, err
			}
		}
		if !pause.For(ctx, waitPoll) {
			return 0, ctx.Err()
		}
	}
	var s string
	if err := p.Conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
		return 0, fmt.Errorf("reading the WAL insert position: %w", err)
	}
	return wal.ParseLSN(s)
}

// waitPoll and waitLogEvery pace CutoverLSN's wait.
const (
	waitPoll     = 100 * time.Millisecond
	waitLogEvery = 5 * time.Second
)

// logOldest logs the oldest transaction with an xid CutoverLSN waits
// for: a backend's (pg_stat_activity, of any database: the snapshot is the
// cluster's) or a prepared one (pg_prepared_xacts).
func (p *PG) logOldest(ctx context.Context, xid string, waited time.Duration) error {
	if p.Log == nil {
		return nil
	}
	var pid *int32
	var db, what, query, started, age string
	err := p.Conn.QueryRow(ctx, `SELECT pid, db, what, query, started::text, (now() - started)::text FROM (
		SELECT pid, coalesce(datname::text, '') AS db, coalesce(state, '') AS what, left(coalesce(query, ''), 200) AS query,
			xact_start AS started, age(backend_xid) AS a FROM pg_stat_activity WHERE backend_xid IS NOT NULL
		UNION ALL
		SELECT NULL, database::text, 'prepared transaction ' || gid, '', prepared, age(transaction) FROM pg_prepared_xacts) t
		ORDER BY a DESC LIMIT 1`).Scan(&pid, &db, &what, &query, &started, &age)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // ended since
	} else if err != nil {
		return fmt.Errorf("reading the oldest transaction open at the cutover's check: %w", err)
	}
	args := []any{"database", db, "state", what, "xact_start", started, "age", age, "query", query,
		"xid", xid, "waited", waited.Round(time.Second).String()}
	if pid != nil {
		args = append(args, "pid", *pid)
	}
	p.Log.Warn("resharding: waiting for every transaction open at the cutover's check to end before recording the cutover (commit or roll back the oldest, or COMMIT/ROLLBACK PREPARED it)", args...)
	return nil
}

// walTables are the outbox tables as package wal names them.
func (p *PG) walTables() []wal.Table {
	out := make([]wal.Table, len(p.Tables))
	for i, t := range p.Tables {
		out[i] = wal.Table{Schema: t.Schema, Name: t.Name}
	}
	return out
}

// EnsureShardPublications creates the publication of each of shards (of
// a count above 1), of every outbox table, when it does not exist (running
// the probe first), or says which statement to run when
// postgres.create_publication is false. The existing ones have each
// table's row filter checked, all of them before anything is decided
// (checkFilters).
func (p *PG) EnsureShardPublications(ctx context.Context, shards []shard.Shard) error {
	var seen []checked
	for _, sh := range shards {
		exists, err := p.publicationExists(ctx, sh.Publication)
		if err != nil {
			return err
		}
		if !exists {
			if err := p.createShardPublication(ctx, sh.Publication, sh.Index, sh.Count); err != nil {
				return err
			}
			continue
		}
		f, err := p.readFilters(ctx, sh.Publication, sh.Index, sh.Count, func(shard.Table) string { return "the transaction at the end of this message" })
		if err != nil {
			return err
		}
		seen = append(seen, checked{sh, f})
	}
	return p.checkFilters(ctx, seen)
}

// checked is a shard's existing publication with what readFilters found.
type checked struct {
	sh shard.Shard
	f  filters
}

func (p *PG) publicationExists(ctx context.Context, name string) (bool, error) {
	var exists bool
	if err := p.Conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)`, name).Scan(&exists); err != nil {
		return false, fmt.Errorf("reading publication %q: %w", name, err)
	}
	return exists, nil
}

// createShardPublication creates the missing publication name of shard i
// of n, running the probe first, or says which statement to run when
// postgres.create_publication is false.
func (p *PG) createShardPublication(ctx context.Context, name string, i, n int) error {
	stmt := shard.PublicationSQL(name, p.Tables, i, n)
	if !p.Cfg.CreatePublication {
		return &PermanentError{wal.Errorf(wal.ErrPublicationMissing, "publication %q of shard %d of %d does not exist and postgres.create_publication is false; create it with %s",
			name, i, n, stmt)}
	}
	if err := p.probeOnce(ctx); err != nil {
		return err
	}
	_, err := p.Conn.Exec(ctx, stmt)
	// duplicate_object, or the unique index of publication names when two
	// instances create it at once: another instance made it.
	if code := sqlState(err); err == nil || code == "42710" || code == "23505" {
		return nil
	}
	if transient(err) {
		return fmt.Errorf("creating publication %q: %w", name, err)
	}
	return &PermanentError{shard.PublicationError(err, name, p.Tables)}
}

// probeOnce runs the probe once per PG.
func (p *PG) probeOnce(ctx context.Context) error {
	if p.probed {
		return nil
	}
	if err := p.probe(ctx); err != nil {
		return err
	}
	p.probed = true
	return nil
}

// probe checks each table's key column (shard.KeyColumnError) and
// Postgres' hashtext() under each key column's collation
// (shard.VerifyProbe).
func (p *PG) probe(ctx context.Context) error {
	probed := map[string]bool{}
	for _, t := range p.Tables {
		k, err := p.keyColumn(ctx, t)
		if err != nil {
			return err
		}
		if probed[k.Collation] {
			continue
		}
		var hashes []int32
		if err := p.Conn.QueryRow(ctx, shard.ProbeCollatedSQL(k.Collation)).Scan(&hashes); err != nil && transient(err) {
			return fmt.Errorf("probing the shard hash: %w", err)
		} else if err != nil {
			return &PermanentError{shard.ProbeError(err)}
		}
		if err := shard.VerifyProbe(hashes); err != nil {
			return &PermanentError{err}
		}
		probed[k.Collation] = true
	}
	return nil
}

// keyColumn reads table t's key column and refuses one the shard filters
// cannot hash (shard.KeyColumnError).
func (p *PG) keyColumn(ctx context.Context, t shard.Table) (shard.KeyColumn, error) {
	var k shard.KeyColumn
	if err := p.Conn.QueryRow(ctx, shard.KeyColumnSQL, t.Schema, t.Name, t.KeyColumn).Scan(k.Fields()...); err != nil {
		return k, fmt.Errorf("reading the key column %q of %s: %w", t.KeyColumn, t, err)
	}
	if err := shard.KeyColumnError(k, t.Schema, t.Name, t.KeyColumn); err != nil {
		return k, &PermanentError{err}
	}
	return k, nil
}

// filters is what readFilters finds of the outbox tables in a shard
// publication: every table is looked at before anything is decided.
type filters struct {
	missing    []shard.Table // not listed
	unfiltered []shard.Table // listed without a row filter
	stale      []shard.Table // outboxd's filter from before NULL keys had a shard
	wrong      []shard.Table // a filter that selects other rows
	why        []error       // why each of wrong is
	narrow     []shard.Table // a column list without a column the router reads (PG.Reads)
	left       [][]string    // the columns each of narrow leaves out
}

func (f filters) ok() bool {
	return len(f.missing)+len(f.unfiltered)+len(f.stale)+len(f.wrong)+len(f.narrow) == 0
}

// listed are the outbox tables the publication lists with a filter or a
// column list to replace.
func (f filters) listed() []shard.Table {
	var out []shard.Table
	for _, t := range slices.Concat(f.unfiltered, f.stale, f.wrong, f.narrow) {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// String says what is wrong with the publication's outbox tables.
func (f filters) String() string {
	var parts []string
	if len(f.missing) > 0 {
		parts = append(parts, "it does not include "+tableNames(f.missing))
	}
	if len(f.unfiltered) > 0 {
		parts = append(parts, "it publishes every row of "+tableNames(f.unfiltered)+" (no row filter), so every shard would deliver them")
	}
	if len(f.stale) > 0 {
		parts = append(parts, "its row filter of "+tableNames(f.stale)+" publishes rows with a NULL key to no shard")
	}
	for _, err := range f.why {
		parts = append(parts, err.Error())
	}
	for j, t := range f.narrow {
		parts = append(parts, fmt.Sprintf("its column list of %s leaves out %s, which outboxd reads", t, strings.Join(f.left[j], ", ")))
	}
	return strings.Join(parts, "; ")
}

func tableNames(tables []shard.Table) string {
	names := make([]string, len(tables))
	for j, t := range tables {
		names[j] = t.String()
	}
	return strings.Join(names, ", ")
}

// readFilters reads the outbox tables of the existing publication name of
// shard i of n and checks each one's row filter (shard.FilterCheckSQL);
// fix(t) is the statement a refusal of t's filter names.
func (p *PG) readFilters(ctx context.Context, name string, i, n int, fix func(shard.Table) string) (filters, error) {
	var f filters
	// attnames names every column when there is no column list.
	rows, err := p.Conn.Query(ctx, `SELECT schemaname::text, tablename::text, to_jsonb(pt) ->> 'rowfilter', coalesce(to_jsonb(pt) -> 'attnames', 'null')
		FROM pg_publication_tables pt WHERE pt.pubname = $1`, name)
	if err != nil {
		return f, fmt.Errorf("reading the row filters of publication %q: %w", name, err)
	}
	listed := map[shard.Table]*string{}
	columns := map[shard.Table][]string{}
	var schema, table string
	var filter *string
	var attnames []string
	_, err = pgx.ForEachRow(rows, []any{&schema, &table, &filter, &attnames}, func() error {
		listed[shard.Table{Schema: schema, Name: table}] = filter
		columns[shard.Table{Schema: schema, Name: table}] = attnames
		return nil
	})
	if err != nil {
		return f, fmt.Errorf("reading the row filters of publication %q: %w", name, err)
	}
	for j, t := range p.Tables {
		actual, ok := listed[shard.Table{Schema: t.Schema, Name: t.Name}]
		if cols := columns[shard.Table{Schema: t.Schema, Name: t.Name}]; ok && cols != nil && j < len(p.Reads) {
			if left := pg.MissingColumns(cols, p.Reads[j]); len(left) > 0 {
				f.narrow = append(f.narrow, t)
				f.left = append(f.left, left)
			}
		}
		switch {
		case !ok:
			f.missing = append(f.missing, t)
			continue
		case actual == nil:
			f.unfiltered = append(f.unfiltered, t)
			continue
		}
		var c shard.FilterCheck
		err := p.Conn.QueryRow(ctx, shard.FilterCheckSQL(*actual, t.KeyColumn, i, n)).Scan(c.Fields()...)
		if err != nil && transient(err) {
			return f, fmt.Errorf("checking the row filter of %s in publication %q: %w", t, name, err)
		}
		err = shard.FilterCheckError(c, err, name, t, fix(t), i, n)
		switch {
		case errors.Is(err, shard.ErrStaleFilter):
			f.stale = append(f.stale, t)
		case err != nil:
			f.wrong = append(f.wrong, t)
			f.why = append(f.why, err)
		}
	}
	return f, nil
}

// options is what readOptions finds wrong with a shard publication's
// options.
type options struct {
	noInsert bool          // it does not publish inserts: nothing after the cutover
	roots    []shard.Table // partitioned outbox tables published under each partition's name
}

func (o options) ok() bool { return !o.noInsert && len(o.roots) == 0 }

func (o options) String() string {
	var parts []string
	if o.noInsert {
		parts = append(parts, "it does not publish INSERTs, so no event would reach the new shard")
	}
	if len(o.roots) > 0 {
		parts = append(parts, "the outbox tables "+tableNames(o.roots)+" are partitioned and it publishes their rows under each partition's name, where each partition's own row filter (none) applies: every shard would deliver them")
	}
	return strings.Join(parts, "; ")
}

// readOptions reads the options of the existing publication name that
// outboxd relies on: publish includes insert, and
// publish_via_partition_root for a partitioned outbox table (as
// shard.PublicationSQL makes it, and wal.EnsurePublicationOf requires of
// one shard's).
func (p *PG) readOptions(ctx context.Context, name string) (options, error) {
	var o options
	var viaRoot bool
	if err := p.Conn.QueryRow(ctx, `SELECT NOT pubinsert, pubviaroot FROM pg_publication WHERE pubname = $1`, name).Scan(&o.noInsert, &viaRoot); err != nil {
		return o, fmt.Errorf("reading publication %q: %w", name, err)
	}
	if viaRoot {
		return o, nil
	}
	for _, t := range p.Tables {
		var partitioned bool
		if err := p.Conn.QueryRow(ctx, `SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)`, t.String()).Scan(&partitioned); err != nil {
			return o, fmt.Errorf("reading outbox table %s: %w", t, err)
		}
		if partitioned {
			o.roots = append(o.roots, t)
		}
	}
	return o, nil
}

// checkNewPublication checks the existing publication name of new shard i
// of n before the cutover (CreatePublications): its options (readOptions),
// and every outbox table listed with its filter and without a column list
// that leaves out a column outboxd reads. With fix and
// postgres.create_publication, a wrong one is put right in one transaction
// that touches only the outbox tables it names (shard.OptionsSQL,
// shard.RefilterStatements); otherwise it is refused, naming that
// transaction. Without fix the outbox tables it lacks are returned, not
// refused: the old shards' publications lack them too (CreatePublications).
func (p *PG) checkNewPublication(ctx context.Context, name string, i, n int, fix bool) ([]shard.Table, error) {
	o, err := p.readOptions(ctx, name)
	if err != nil {
		return nil, err
	}
	var f filters
	if len(o.roots) == 0 {
		// Without publish_via_partition_root the tables are listed by
		// their partitions' names: checked once that is set.
		f, err = p.readFilters(ctx, name, i, n, func(t shard.Table) string { return shard.RefilterSQL(name, []shard.Table{t}, nil, i, n) })
		if err != nil {
			return nil, err
		}
	}
	var missing []shard.Table
	if !fix {
		missing, f.missing = f.missing, nil
	}
	if o.ok() && f.ok() {
		return missing, nil
	}
	var stmts []string
	var wrong []string
	if !o.ok() {
		stmts = append(stmts, shard.OptionsSQL(name))
		wrong = append(wrong, o.String())
	}
	if !f.ok() {
		stmts = append(stmts, shard.RefilterStatements(name, f.listed(), f.missing, i, n)...)
		wrong = append(wrong, f.String())
	}
	stmt := shard.TxSQL(stmts)
	what := fmt.Sprintf("publication %q of new shard %d of %d: %s", name, i, n, strings.Join(wrong, "; "))
	if len(o.roots) > 0 {
		what += " (its tables and row filters are checked once that is put right)"
	}
	switch {
	case !fix:
		return missing, &PermanentError{fmt.Errorf("%s; %s puts it right", what, stmt)}
	case !p.Cfg.CreatePublication:
		return nil, &PermanentError{fmt.Errorf("%s, and postgres.create_publication is false: run %s and start outboxd again", what, stmt)}
	}
	if err := p.probeOnce(ctx); err != nil {
		return nil, err
	}
	err = p.runTx(ctx, stmts)
	if err != nil && transient(err) {
		return nil, fmt.Errorf("putting publication %q right with %s: %w", name, stmt, err)
	} else if err != nil {
		return nil, &PermanentError{fmt.Errorf("%s; putting it right with %s: %w", what, stmt, err)}
	}
	if p.Log != nil {
		p.Log.Info("put a new shard's publication right before the reshard's cutover", "publication", name, "statement", stmt)
	}
	if len(o.roots) > 0 {
		return p.checkNewPublication(ctx, name, i, n, fix) // its tables, now listed by the roots' names
	}
	return nil, nil
}

// refilter runs shard.RefilterStatements in one transaction.
func (p *PG) refilter(ctx context.Context, name string, listed, missing []shard.Table, i, n int) error {
	return p.runTx(ctx, shard.RefilterStatements(name, listed, missing, i, n))
}

// runTx runs stmts in one transaction.
func (p *PG) runTx(ctx context.Context, stmts []string) error {
	return pgx.BeginFunc(ctx, p.Conn, func(tx pgx.Tx) error {
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	})
}

// checkFilters decides on the row filters of the outbox tables in the
// existing publications of shards that stream or drain, read by
// readFilters. A filter that selects other rows, on any table of any of
// them, is refused with one transaction that re-filters every such table
// in every such publication (shard.RefilterStatements, only the tables
// named; a stale filter beside them too): put right one publication at a
// time, a row whose key column changed between two fixes would reach both
// shards, or neither (second review of issue 35 §1, S4). Otherwise a
// filter from before NULL keys had a shard is fixed when
// postgres.create_publication is true, and refused otherwise: either way
// the rows with a NULL key committed before the fix were published to no
// slot, and the log or the refusal says so with the query that finds
// them. A publication that lacks a table is refused with the transaction
// that adds it to every shard publication (refuseMissing); a table without
// a filter is left to the start-up checks, which explain it (preflight).
// outboxd fixes neither itself: the rows committed before reached no
// shard, or every shard.
func (p *PG) checkFilters(ctx context.Context, seen []checked) error {
	var why []error
	for _, c := range seen {
		why = append(why, c.f.why...)
	}
	if len(why) > 0 {
		var stmts []string
		for _, c := range seen {
			if tables := slices.Concat(c.f.wrong, c.f.stale); len(tables) > 0 {
				stmts = append(stmts, shard.RefilterStatements(c.sh.Publication, tables, nil, c.sh.Index, c.sh.Count)...)
			}
			if lost, stale := staleOf(c, "the transaction at the end of this message"); stale != nil {
				why = append(why, fmt.Errorf("%w. %s", stale, lost))
			}
		}
		return &PermanentError{fmt.Errorf("%w. Put every wrong filter right at once, with outboxd stopped: %s. "+
			"A wrong filter that came from changing a table's router.key_column at more than one shard reorders that table's events across the change, since a row's old and new key may hash to different shards",
			errors.Join(why...), shard.TxSQL(stmts))}
	}
	for _, c := range seen {
		name, i, n := c.sh.Publication, c.sh.Index, c.sh.Count
		if len(c.f.stale) > 0 {
			lost, stale := staleOf(c, shard.RefilterSQL(name, c.f.stale, nil, i, n))
			if err := p.fixStale(ctx, name, c.f.stale, stale, lost, i, n); err != nil {
				return err
			}
		}
		if len(c.f.missing) > 0 {
			return p.refuseMissing(ctx, name, c.f.missing, i, n)
		}
	}
	return nil
}

// staleOf says what the stale filters of c's publication mean (stale),
// naming fix as the statement that fixes them, and which rows with a NULL
// key they published to no shard, with the queries that find them (lost);
// nil when there is none.
func staleOf(c checked, fix string) (lost string, stale error) {
	if len(c.f.stale) == 0 {
		return "", nil
	}
	queries := make([]string, len(c.f.stale))
	nulls := make([]string, len(c.f.stale))
	for j, t := range c.f.stale {
		queries[j] = shard.NullKeysSQL(t)
		nulls[j] = fmt.Sprintf("column %q of %s is NULL", t.KeyColumn, t)
	}
	lost = fmt.Sprintf("The rows with a NULL key committed before then were published to no shard's slot and are lost to outboxd: find them with %s (while the table keeps them) and deliver them by hand",
		strings.Join(queries, "; "))
	return lost, fmt.Errorf("publication %q of shard %d of %d: %w (%s), so outboxd never sees such a row: %s fixes it",
		c.sh.Publication, c.sh.Index, c.sh.Count, shard.ErrStaleFilter, strings.Join(nulls, "; "), fix)
}

// refuseMissing refuses the publication name of shard i of n, which lacks
// the outbox tables missing (new to postgres.tables), with the one
// transaction that adds each table to every shard publication that lacks
// it (shard.AddLacksSQL): added one publication at a time, each shard
// would miss its rows written before its own ADD, at another position
// for each (review of issue 35 §1, S1). While a reshard is recorded, that
// is every existing publication of both shard counts: the old shards
// deliver the rows up to the cutover, the new ones those after it, and a
// transaction naming only the draining shards' publications would let the
// application write rows after the cutover that no new shard publishes
// (second review of issue 35 §1, M1). The same holds at the cutover's
// check, before the cutover is recorded (third review, M2). The filters
// need a key column they can hash: that is checked first.
func (p *PG) refuseMissing(ctx context.Context, name string, missing []shard.Table, i, n int) error {
	for _, t := range missing {
		if _, err := p.keyColumn(ctx, t); err != nil {
			return err
		}
	}
	counts := []int{n}
	plan, err := readPlan(ctx, p.Conn, p.Cfg)
	if err != nil {
		return err
	}
	if plan != nil {
		counts = []int{plan.From, plan.To}
	}
	var lacks []shard.Lack
	// Whether a publication of each count lists one of missing already
	// (an earlier ADD TABLE of some of them), and whether one lacks one.
	listsAny, lacksAny := map[int]bool{}, map[int]bool{}
	for _, count := range counts {
		pubs, err := p.existingPublications(ctx, count) // a missing one is made with every table
		if err != nil {
			return err
		}
		for _, l := range pubs {
			listed, err := p.listedTables(ctx, l.Publication)
			if err != nil {
				return err
			}
			for _, t := range p.Tables {
				if !listed[shard.Table{Schema: t.Schema, Name: t.Name}] {
					l.Tables = append(l.Tables, t)
					lacksAny[count] = lacksAny[count] || slices.Contains(missing, t)
				} else if slices.Contains(missing, t) {
					listsAny[count] = true
				}
			}
			lacks = append(lacks, l)
		}
	}
	every := "every shard's publication"
	if plan != nil {
		every = fmt.Sprintf("every shard's publication, of the %d old shards and of the %d new ones of the reshard in progress,", plan.From, plan.To)
	}
	before := rowsBefore(plan, counts[0], listsAny, lacksAny)
	return &PermanentError{wal.Errorf(wal.ErrPublicationMissing, "publication %q of shard %d of %d does not include %s, so none of its rows whose key hashes to shard %d reach outboxd. "+
		"Add the tables to %s at once, with outboxd stopped and before the application first writes them: %s. %s",
		name, i, n, tableNames(missing), i, every, shard.AddLacksSQL(lacks), before)}
}

// rowsBefore says which shards deliver the rows of the tables refuseMissing
// refuses that were written before its transaction, and which to replay,
// given whether a publication of each shard count lists one of them
// already and whether one lacks one. Before the cutover of a reshard
// recorded, or without one, the shards of count first deliver them all
// (the new ones only those past a cutover the start after the fix
// records); once it is recorded, the old shards those up to it and the
// new ones those past it, where their publications list them (fourth
// review of issue 35 §1, S2).
func rowsBefore(plan *shard.Plan, first int, listsAny, lacksAny map[int]bool) string {
	if plan == nil || (plan.Phase != shard.Draining && plan.Phase != shard.Switched) {
		switch {
		case !listsAny[first]:
			return "Rows of them written before that transaction are published to no shard: send them with outboxd replay"
		case plan == nil:
			return "Rows of them written before that transaction are published only by the shard publications that list them already (an earlier ADD TABLE of some of them), and to no other shard: send the missing ones with outboxd replay"
		}
		return fmt.Sprintf("Rows of them written before that transaction reach a shard only where the publication that delivers them lists them already (an earlier ADD TABLE of some of them): up to the cutover those of the %d old shards, past it those of the %d new ones; send the missing ones with outboxd replay", plan.From, plan.To)
	}
	deliver := func(count int, which string) string {
		switch {
		case !lacksAny[count]:
			return fmt.Sprintf("the %d %s shards deliver them (their publications list them)", count, which)
		case listsAny[count]:
			return fmt.Sprintf("only those of the %d %s shards whose publications list them already deliver them", count, which)
		}
		return fmt.Sprintf("no shard delivers them (the %d %s shards' publications lack them)", count, which)
	}
	return fmt.Sprintf("Rows of them written before that transaction and up to the cutover at %s (recorded): %s. Written past it: %s. Send with outboxd replay only those no shard delivered: replaying the others repeats them",
		plan.Cutover, deliver(plan.From, "old"), deliver(plan.To, "new"))
}

// listedTables reads the tables of publication pub.
func (p *PG) listedTables(ctx context.Context, pub string) (map[shard.Table]bool, error) {
	rows, err := p.Conn.Query(ctx, `SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1`, pub)
	if err != nil {
		return nil, fmt.Errorf("reading the tables of publication %q: %w", pub, err)
	}
	listed := map[shard.Table]bool{}
	var t shard.Table
	if _, err := pgx.ForEachRow(rows, []any{&t.Schema, &t.Name}, func() error {
		listed[t] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading the tables of publication %q: %w", pub, err)
	}
	return listed, nil
}

// fixStale fixes the stale filters of the tables stale in publication name
// of shard i of n (checkFilters), or refuses when
// postgres.create_publication is false.
func (p *PG) fixStale(ctx context.Context, name string, tables []shard.Table, stale error, lost string, i, n int) error {
	if !p.Cfg.CreatePublication {
		return &PermanentError{fmt.Errorf("%w; postgres.create_publication is false, so run it yourself and restart outboxd. %s", stale, lost)}
	}
	stmt := shard.RefilterSQL(name, tables, nil, i, n)
	if err := p.refilter(ctx, name, tables, nil, i, n); err != nil && transient(err) {
		return fmt.Errorf("fixing the row filter of publication %q with %s: %w", name, stmt, err)
	} else if err != nil {
		return &PermanentError{fmt.Errorf("fixing the row filter of publication %q, which publishes rows with a NULL key to no shard, with %s: %w", name, stmt, err)}
	}
	if p.Log != nil {
		p.Log.Warn("fixed the row filter of the shard publication, which published rows with a NULL key to no shard; shard 0 delivers them from here on (router.require_key applies). "+lost,
			"publication", name, "statement", stmt)
	}
	return nil
}

// CreateSlots creates the slots named (pgoutput).
func (p *PG) CreateSlots(ctx context.Context, names []string) error {
	for _, name := range names {
		if !p.Cfg.CreateSlot {
			return &PermanentError{wal.Errorf(wal.ErrSlotMissing, "replication slot %q does not exist and postgres.create_slot is false; create it with %s",
				name, wal.CreateSlotSQL(name, p.Cfg.FailoverSlot))}
		}
		if _, err := wal.CreateSlot(ctx, p.Conn, name, p.Cfg.FailoverSlot); err != nil && sqlState(err) != "42710" {
			return err
		}
	}
	return nil
}

// SetPhase writes the row's phase where it still holds the observed plan.
func (p *PG) SetPhase(ctx context.Context, o shard.Plan, phase shard.Phase, cutover wal.LSN) (bool, error) {
	var set *string
	if cutover != 0 {
		s := cutover.String()
		set = &s
	}
	tag, err := p.Conn.Exec(ctx, `UPDATE `+p.table()+` SET phase = $1, cutover = coalesce($2::pg_lsn, cutover), updated_at = now()
		WHERE slot = $3 AND phase = $4 AND from_shards = $5 AND to_shards = $6`,
		string(phase), set, p.Cfg.Slot, string(o.Phase), o.From, o.To)
	if err != nil {
		return false, fmt.Errorf("recording reshard phase %s: %w", phase, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Delete deletes the row where it still holds the observed plan.
func (p *PG) Delete(ctx context.Context, o shard.Plan) (bool, error) {
	tag, err := p.Conn.Exec(ctx, `DELETE FROM `+p.table()+` WHERE slot = $1 AND phase = $2 AND from_shards = $3 AND to_shards = $4`,
		p.Cfg.Slot, string(o.Phase), o.From, o.To)
	if err != nil {
		return false, fmt.Errorf("deleting the reshard's row: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// DropSlots drops the slots, terminating the backends that hold them.
func (p *PG) DropSlots(ctx context.Context, names []string) error {
	for _, name := range names {
		for attempt := 0; ; attempt++ {
			if _, err := p.Conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, name); err != nil {
				return fmt.Errorf("ending the holder of slot %q: %w", name, err)
			}
			_, err := p.Conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name)
			if err == nil {
				break
			}
			if sqlState(err) != "55006" || attempt >= 50 { // object_in_use: the holder is still ending
				return fmt.Errorf("dropping slot %q: %w", name, err)
			}
			if !pause.For(ctx, 100*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	return nil
}

// DropPublications drops the publications.
func (p *PG) DropPublications(ctx context.Context, names []string) error {
	for _, name := range names {
		if _, err := p.Conn.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{name}.Sanitize()); err != nil {
			return fmt.Errorf("dropping publication %q: %w", name, err)
		}
	}
	return nil
}

// Advance moves each slot to lsn, then runs CHECKPOINT: Postgres writes
// an advanced slot's state to disk only at the next checkpoint (unless the
// advance also moved its restart_lsn), so a crash before it would put the
// slot back where it was created, before the cutover, and the new shards
// would deliver again what the old ones delivered. CHECKPOINT needs
// superuser or pg_checkpoint; without it the advance is durable at the
// server's next checkpoint, and until then the new shards' window (Run)
// covers a crash of Postgres alone.
func (p *PG) Advance(ctx context.Context, names []string, to wal.LSN) error {
	for _, name := range names {
		if _, err := p.Conn.Exec(ctx, `SELECT pg_replication_slot_advance($1, $2::pg_lsn)`, name, to.String()); err != nil {
			return fmt.Errorf("advancing slot %q to the cutover %s: %w", name, to, err)
		}
	}
	_, err := p.Conn.Exec(ctx, `CHECKPOINT`)
	switch {
	case sqlState(err) == "42501": // insufficient_privilege
		if p.Log != nil {
			p.Log.Warn("could not run CHECKPOINT after advancing the new shards' slots to the cutover; Postgres writes the advance to disk at its next checkpoint. "+
				"Until then a crash of Postgres together with a restart of outboxd makes the new shards deliver again the events between their slots' creation and the cutover. "+
				"GRANT pg_checkpoint TO the role makes the advance durable at once",
				"slots", names, "cutover", to.String(), "err", err)
		}
	case err != nil:
		return fmt.Errorf("writing the advanced slots to disk (CHECKPOINT): %w", err)
	}
	return nil
}

// TxnEnd returns the end LSN of the transaction whose commit record
// starts at commit, as the idle logical slot (of publication pub) streams
// it: ok is false when the slot holds no such transaction. It peeks (the
// slot does not move), decoding from the slot's restart point up to that
// commit record and no further. In exactly-once mode a position may say
// that only part of a transaction's rows are in Kafka; the cutover is then
// taken at that transaction's end, so that the old shard delivers the rest
// of it and the new shards none.
func (p *PG) TxnEnd(ctx context.Context, slot, pub string, commit wal.LSN) (end wal.LSN, ok bool, err error) {
	// pgoutput's Commit message: 'C', flags (1 byte), the commit LSN, the
	// end LSN (8 bytes each), the commit time.
	rows, err := p.Conn.Query(ctx, `SELECT substr(data, 3, 16) FROM pg_logical_slot_peek_binary_changes($1, $2::pg_lsn, NULL,
			'proto_version', '1', 'publication_names', $3, 'messages', 'true')
		WHERE get_byte(data, 0) = 67`, slot, (commit + 1).String(), pgx.Identifier{pub}.Sanitize())
	if err != nil {
		return 0, false, fmt.Errorf("reading slot %q up to the transaction committing at %s: %w", slot, commit, err)
	}
	var b []byte
	_, err = pgx.ForEachRow(rows, []any{&b}, func() error {
		if len(b) == 16 && wal.LSN(binary.BigEndian.Uint64(b)) == commit {
			end, ok = wal.LSN(binary.BigEndian.Uint64(b[8:])), true
		}
		return nil
	})
	if err != nil {
		return 0, false, fmt.Errorf("reading slot %q up to the transaction committing at %s: %w", slot, commit, err)
	}
	return end, ok, nil
}

// transient reports an error that says nothing about the statement: no
// answer from the server (no SQLSTATE), or a server error of a class that a
// retry can clear: connection exceptions (08), transaction rollbacks such
// as serialization failures and deadlocks (40), insufficient resources
// (53), a lock not available or an object in use (55P03, 55006),
// operator intervention such as a cancel or a shutdown (57), and
// system errors (58), but for the codes of those classes that a retry
// cannot clear. Everything else is the statement's own fault.
func transient(err error) bool {
	code := sqlState(err)
	switch code {
	case "":
		return true
	case "57P04", "53400", "08P01", "40002": // database dropped, configuration limit, protocol violation, integrity constraint
		return false
	}
	switch code[:min(2, len(code))] {
	case "08", "40", "53", "57", "58":
		return true
	}
	return code == "55P03" || code == "55006"
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
