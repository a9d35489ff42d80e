package pg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/quote"
	"github.com/outboxd/outboxd/shard"
)

// The event trigger that adds a table a pattern of postgres.tables matches
// to the publication in the transaction that creates it (DESIGN.md,
// "Tables created while outboxd runs"). The patterns it knows are the rows
// of PatternTable, one per publication and pattern, written by outboxd
// migrate (InstallTrigger): one trigger serves every outboxd of the
// database, and outboxd reads the rows at start-up to check that they are
// its patterns.
const (
	TriggerName = "outboxd_add_tables"
	// TriggerSchema holds the pattern table and the trigger's function.
	// outboxd migrate creates it, and it and everything in it must belong
	// to a superuser or to the event trigger's owner (checkOwners): the
	// function runs, as its owner, in every superuser's CREATE TABLE, so
	// whoever owned it, or could make it first (as any role that may
	// create in public could there), could run anything as a superuser.
	TriggerSchema = "outboxd_trigger"
	PatternTable  = TriggerSchema + ".patterns"
	triggerFunc   = TriggerSchema + ".add_tables"
)

// triggerTags are the commands the trigger fires on. CREATE SCHEMA fires
// it once for the schema and the tables its own CREATE TABLE elements make
// (they fire no event of their own); ALTER SCHEMA for a schema renamed
// into a matching name with its tables.
var triggerTags = []string{"CREATE TABLE", "CREATE TABLE AS", "SELECT INTO", "ALTER TABLE", "CREATE SCHEMA", "ALTER SCHEMA"}

// triggerBody is the trigger's function, which CheckTrigger compares with
// the one installed.
const triggerBody = `
DECLARE
	cmd record;
	m record;
BEGIN
	-- A schema renamed into a matching name brings its tables; a schema
	-- CREATE SCHEMA makes has its tables listed as CREATE TABLE commands.
	FOR cmd IN SELECT * FROM pg_event_trigger_ddl_commands()
		WHERE object_type = 'table' OR (object_type = 'schema' AND command_tag = 'ALTER SCHEMA') LOOP
		-- One row per publication and table: two patterns of a publication
		-- may match one table, which is added once.
		-- An unlogged table is taken whether or not the publication
		-- exists: no publication can publish it.
		FOR m IN SELECT DISTINCT ON (p.publication, c.oid) p.publication, p.pattern, n.nspname::text AS nspname, c.relname::text AS relname,
				c.relpersistence = 'u' AS unlogged
			FROM ` + PatternTable + ` p, pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE CASE WHEN cmd.object_type = 'schema' THEN c.relnamespace ELSE c.oid END = cmd.objid
				AND ` + outboxKinds + `
				AND n.nspname LIKE p.schema_like AND c.relname LIKE p.table_like
				AND (c.relpersistence = 'u' OR (EXISTS (SELECT 1 FROM pg_publication b WHERE b.pubname = p.publication)
					AND NOT EXISTS (SELECT 1 FROM pg_publication_rel r JOIN pg_publication b ON b.oid = r.prpubid
						WHERE b.pubname = p.publication AND r.prrelid = c.oid)))
			ORDER BY p.publication, c.oid, p.pattern
		LOOP
			IF m.unlogged THEN
				RAISE EXCEPTION 'outboxd: %.% matches the outbox table pattern % of publication %, but is UNLOGGED', m.nspname, m.relname, m.pattern, m.publication
					USING DETAIL = 'Postgres writes no WAL for the rows of an unlogged table, so no publication can publish it and its rows would never be delivered',
						HINT = 'create it without UNLOGGED, or give it a name the pattern does not match';
			ELSIF cmd.command_tag = 'CREATE TABLE' THEN
				EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I.%I', m.publication, m.nspname, m.relname);
			ELSIF cmd.command_tag = 'ALTER TABLE' THEN
				-- Any ALTER TABLE, ADD COLUMN included: of a table that
				-- matched before its pattern was recorded, or was removed
				-- from the publication, as of one renamed or moved into a
				-- matching name (review-patterns35 S3).
				RAISE EXCEPTION 'outboxd: %.% matches the outbox table pattern % of publication %, which does not publish it', m.nspname, m.relname, m.pattern, m.publication
					USING DETAIL = 'the event trigger refuses any ALTER TABLE of a table a pattern matches while the publication does not publish it (a table that matched before the pattern was recorded, one removed from the publication, or one renamed or moved into a matching name): its rows written so far were never published and are not delivered',
						HINT = format('publish it with the statement, as a superuser, in one transaction with the trigger disabled for that transaction only: '
							'BEGIN; ALTER EVENT TRIGGER ` + TriggerName + ` DISABLE; <this statement>; ALTER PUBLICATION %I ADD TABLE %I.%I; ALTER EVENT TRIGGER ` + TriggerName + ` ENABLE ALWAYS; COMMIT '
							'(or ADD TABLE it by the name it has before this statement, which a rename or SET SCHEMA changes, then run the statement again); '
							'its rows written before are not delivered: send them with outboxd replay. Or remove the pattern from postgres.tables and run outboxd migrate, or give the table a name the pattern does not match',
							m.publication, m.nspname, m.relname);
			ELSIF cmd.command_tag = 'ALTER SCHEMA' THEN
				-- The names the hint gives are the ones the statement
				-- gives, which exist only once it has run (review-fix59 S1).
				RAISE EXCEPTION 'outboxd: %.% matches the outbox table pattern % of publication %, which does not publish it', m.nspname, m.relname, m.pattern, m.publication
					USING DETAIL = 'ALTER SCHEMA brought it into a matching name while the publication does not publish it: its rows written so far were never published and are not delivered',
						HINT = format('publish the schema''s tables with the statement, as a superuser, in one transaction with the trigger disabled for that transaction only: '
							'BEGIN; ALTER EVENT TRIGGER ` + TriggerName + ` DISABLE; <this statement>; ALTER PUBLICATION %I ADD TABLE %s; ALTER EVENT TRIGGER ` + TriggerName + ` ENABLE ALWAYS; COMMIT '
							'(or ADD TABLE them by their names before this statement, then run the statement again); '
							'their rows written before are not delivered: send them with outboxd replay. Or give the schema a name the pattern does not match',
							m.publication, (SELECT string_agg(format('%I.%I', n.nspname, c.relname), ', ' ORDER BY c.relname)
								FROM ` + PatternTable + ` p, pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
								WHERE p.publication = m.publication AND c.relnamespace = cmd.objid AND ` + outboxKinds + ` AND c.relpersistence <> 'u'
									AND n.nspname LIKE p.schema_like AND c.relname LIKE p.table_like
									AND NOT EXISTS (SELECT 1 FROM pg_publication_rel r JOIN pg_publication b ON b.oid = r.prpubid
										WHERE b.pubname = p.publication AND r.prrelid = c.oid)));
			ELSE
				RAISE EXCEPTION 'outboxd: %.% matches the outbox table pattern % of publication %, which does not publish it', m.nspname, m.relname, m.pattern, m.publication
					USING DETAIL = cmd.command_tag || ' made it while the publication does not publish it: rows written to it before would never be delivered (CREATE TABLE AS and SELECT INTO write rows before the table can be published)',
						HINT = 'create the table with CREATE TABLE and then INSERT, or give it a name the pattern does not match';
			END IF;
		END LOOP;
		-- A partition, at any depth, of a matching table that is UNLOGGED:
		-- made so (CREATE UNLOGGED TABLE … PARTITION OF), attached (ALTER
		-- TABLE … ATTACH PARTITION, whose row is the parent) or changed
		-- (ALTER TABLE … SET UNLOGGED of the partition). Postgres allows
		-- each, and the root's publication publishes none of its rows.
		FOR m IN SELECT p.publication, p.pattern, n.nspname::text AS nspname, c.relname::text AS relname,
				format('%I.%I', qn.nspname, q.relname) AS part
			FROM ` + PatternTable + ` p, pg_class x
				CROSS JOIN LATERAL pg_partition_tree(x.oid) t
				JOIN pg_class q ON q.oid = t.relid JOIN pg_namespace qn ON qn.oid = q.relnamespace,
				pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE CASE WHEN cmd.object_type = 'schema' THEN x.relnamespace ELSE x.oid END = cmd.objid
				AND q.relispartition AND q.relpersistence = 'u'
				AND c.oid = pg_partition_root(x.oid)
				AND ` + outboxKinds + `
				AND n.nspname LIKE p.schema_like AND c.relname LIKE p.table_like
			ORDER BY 5, 1, 2 LIMIT 1
		LOOP
			RAISE EXCEPTION 'outboxd: %.% matches the outbox table pattern % of publication %, but its partition % is UNLOGGED', m.nspname, m.relname, m.pattern, m.publication, m.part
				USING DETAIL = 'Postgres writes no WAL for the rows of an unlogged partition, so the publication publishes none of them and they would never be delivered',
					HINT = 'create or attach the partition without UNLOGGED, or make it logged (ALTER TABLE ' || m.part || ' SET LOGGED)';
		END LOOP;
	END LOOP;
END
`

// triggerSQL installs, in TriggerSchema, the pattern table and the
// trigger's function, and the trigger, idempotently. The function is
// SECURITY DEFINER, owned by the superuser who runs migrate, for ALTER
// PUBLICATION … ADD TABLE needs
// ownership of the table and the publication. It skips a publication
// that does not exist yet (outboxd creates it FOR TABLE the tables the
// patterns match). It refuses, aborting the transaction, a matching table
// made with its rows already in it (CREATE TABLE AS, SELECT INTO) and a
// table renamed or moved into a matching name, itself (ALTER TABLE) or by
// its schema (ALTER SCHEMA … RENAME): their rows, or some of them, would
// never be published. A table made by CREATE SCHEMA's own CREATE TABLE is
// added as one made by CREATE TABLE alone: the event fires once, for
// CREATE SCHEMA, and lists the table's CREATE TABLE among its commands.
// It refuses an UNLOGGED table a pattern matches, made so or changed,
// whatever the command, and an UNLOGGED partition, at any depth, of such
// a table, made, attached or changed: Postgres writes no WAL for their
// rows, so they would never be delivered (review-eosbf MF1, review-fix55
// Must 1). It looks at the tables a pattern
// matches at start-up (pg.MatchTables): partitions are left out, for their
// parent publishes them (publish_via_partition_root), and so are temporary
// tables, in their pg_temp schemas, and tables of the system schemas.
var triggerSQL = []string{
	`GRANT USAGE ON SCHEMA ` + TriggerSchema + ` TO PUBLIC`,
	`CREATE TABLE IF NOT EXISTS ` + PatternTable + ` (
		publication text NOT NULL,
		pattern text NOT NULL,
		schema_like text NOT NULL,
		table_like text NOT NULL,
		PRIMARY KEY (publication, pattern))`,
	`REVOKE ALL ON ` + PatternTable + ` FROM PUBLIC`,
	`GRANT SELECT ON ` + PatternTable + ` TO PUBLIC`,
	`CREATE OR REPLACE FUNCTION ` + triggerFunc + `() RETURNS event_trigger
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$` + triggerBody + `$fn$`,
	`REVOKE ALL ON FUNCTION ` + triggerFunc + `() FROM PUBLIC`,
	// Made again, so that one installed by an earlier outboxd fires on
	// the commands of this one (CheckTrigger compares them).
	`DROP EVENT TRIGGER IF EXISTS ` + TriggerName,
	`CREATE EVENT TRIGGER ` + TriggerName + ` ON ddl_command_end
		WHEN TAG IN ('` + strings.Join(triggerTags, "', '") + `')
		EXECUTE FUNCTION ` + triggerFunc + `()`,
	// Fires also under session_replication_role = replica (pg_restore,
	// logical replication apply).
	`ALTER EVENT TRIGGER ` + TriggerName + ` ENABLE ALWAYS`,
}

// InstallTrigger installs the event trigger and records the patterns of
// pc.Tables as the patterns of pc.Publication, replacing the ones recorded
// before, in one transaction. It needs a superuser (CREATE EVENT TRIGGER).
// It refuses TriggerSchema, or anything in it, that belongs to a role
// other than a superuser and the one that runs it (checkOwners), and
// checks what it installed as CheckTrigger does. When the publication
// exists it adds to it, in the same transaction, the tables the patterns
// match that it does not publish (a pattern added to a deployment, or a
// table that matched before its pattern was recorded), and returns their
// names, quoted (outboxd migrate refuses this while the deployment's slot
// is streamed: RefuseWhileStreaming): else the trigger would refuse
// any ALTER TABLE of them and the check while outboxd streams would stop
// it. Their rows written before are not delivered (review-patterns35 S3).
// An UNLOGGED one is left out (UnloggedMatching names it, and the
// start-up check refuses it, with the statements that make it logged).
func InstallTrigger(ctx context.Context, conn *pgx.Conn, pc config.Postgres) (added []string, err error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	failed := func(err error) error {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return fmt.Errorf("installing the event trigger %s, which adds the tables a pattern of postgres.tables matches to publication %q as they are created: %w; "+
				"it needs a superuser (CREATE EVENT TRIGGER): run outboxd migrate with a superuser's postgres.dsn (outboxd itself runs with the least-privilege role)", TriggerName, pc.Publication, err)
		}
		return fmt.Errorf("installing the event trigger %s: %w", TriggerName, err)
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+TriggerSchema); err != nil {
		return nil, failed(err)
	}
	// Before anything is written into it: a function another role made
	// first keeps its owner through CREATE OR REPLACE.
	if err := checkOwners(ctx, tx, "(SELECT oid FROM pg_roles WHERE rolname = current_user)"); err != nil {
		return nil, err
	}
	for _, q := range triggerSQL {
		if _, err := tx.Exec(ctx, q); err != nil {
			return nil, failed(err)
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+PatternTable+` WHERE publication = $1`, pc.Publication); err != nil {
		return nil, fmt.Errorf("recording the patterns of postgres.tables: %w", err)
	}
	for _, e := range pc.Tables {
		if !e.Pattern() {
			continue
		}
		schema, table := e.Split()
		if _, err := tx.Exec(ctx, `INSERT INTO `+PatternTable+` VALUES ($1, $2, $3, $4)`,
			pc.Publication, e.Name, config.LikePattern(schema), config.LikePattern(table)); err != nil {
			return nil, fmt.Errorf("recording the pattern %s of postgres.tables: %w", e.Name, err)
		}
	}
	if added, err = publishMatching(ctx, tx, pc); err != nil {
		return nil, err
	}
	if err := CheckTrigger(ctx, tx, pc); err != nil {
		return nil, fmt.Errorf("checking the event trigger just installed: %w", err)
	}
	return added, tx.Commit(ctx)
}

// patternTablesQuery lists the tables that the patterns whose LIKE forms
// are $2 and $3 match, as the trigger matches them: each quoted, its
// schema and name, whether it is UNLOGGED and partitioned, and whether
// publication $1 exists and does not publish it.
const patternTablesQuery = `SELECT format('%I.%I', n.nspname, c.relname), n.nspname::text, c.relname::text, c.relpersistence = 'u', c.relkind = 'p',
		EXISTS (SELECT 1 FROM pg_publication b WHERE b.pubname = $1)
			AND NOT EXISTS (SELECT 1 FROM pg_publication_rel r JOIN pg_publication b ON b.oid = r.prpubid WHERE b.pubname = $1 AND r.prrelid = c.oid)
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE ` + outboxKinds + `
		AND EXISTS (SELECT 1 FROM unnest($2::text[], $3::text[]) l(s, t) WHERE n.nspname LIKE l.s AND c.relname LIKE l.t)
	ORDER BY 1`

// patternTable is a row of patternTablesQuery.
type patternTable struct {
	quoted, schema, table              string
	unlogged, partitioned, unpublished bool
}

// patternTables runs patternTablesQuery for the patterns of pc.Tables and
// publication pc.Publication.
func patternTables(ctx context.Context, q querier, pc config.Postgres) ([]patternTable, error) {
	schemaLike, tableLike := likeForms(pc)
	rows, err := q.Query(ctx, patternTablesQuery, pc.Publication, schemaLike, tableLike)
	if err != nil {
		return nil, fmt.Errorf("listing the tables the patterns of postgres.tables match: %w", err)
	}
	var r patternTable
	var out []patternTable
	if _, err := pgx.ForEachRow(rows, []any{&r.quoted, &r.schema, &r.table, &r.unlogged, &r.partitioned, &r.unpublished}, func() error {
		out = append(out, r)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("listing the tables the patterns of postgres.tables match: %w", err)
	}
	return out, nil
}

// unpublished returns, quoted, the tables the patterns of pc.Tables match
// that publication pc.Publication, which exists, does not publish: those
// outboxd migrate adds to it. UNLOGGED ones are left out: no publication
// can publish them (UnloggedMatching).
func unpublished(ctx context.Context, q querier, pc config.Postgres) ([]string, error) {
	all, err := patternTables(ctx, q, pc)
	var names []string
	for _, r := range all {
		if r.unpublished && !r.unlogged {
			names = append(names, r.quoted)
		}
	}
	return names, err
}

// UnloggedMatching returns the UNLOGGED tables the patterns of pc.Tables
// match, each the entry's config.Postgres.EntryOf gives, as the
// *UnloggedError MatchTables refuses it with at start-up, with its
// remedy: outboxd migrate leaves them out of the publication, which
// cannot publish them, and says so (review-fix59 S3); the periodic check
// tells them from the tables the publication lacks.
func UnloggedMatching(ctx context.Context, q querier, pc config.Postgres) ([]*UnloggedError, error) {
	all, err := patternTables(ctx, q, pc)
	if err != nil {
		return nil, err
	}
	var out []*UnloggedError
	for _, r := range all {
		// LIKE compares by the database's collation; Matches exactly.
		j, ok := pc.EntryOf(r.schema, r.table)
		if !r.unlogged || !ok || !pc.Tables[j].Pattern() || !pc.Tables[j].Matches(r.schema, r.table) {
			continue
		}
		ue := &UnloggedError{Match: Match{Schema: r.schema, Table: r.table, Entry: j}, Pattern: pc.Tables[j].Name, Partitioned: r.partitioned}
		if !ue.Partitioned {
			if ue.Recorded, err = RecordedFor(ctx, q, r.schema, r.table); err != nil {
				return nil, fmt.Errorf("outbox table %s (postgres.tables[%d]) is UNLOGGED, and reading the patterns recorded for the event trigger failed: %w", ue.Name(), j, err)
			}
		}
		out = append(out, ue)
	}
	return out, nil
}

// likeForms are the LIKE forms of the schema and the table parts of the
// patterns of pc.Tables, in their order.
func likeForms(pc config.Postgres) (schemaLike, tableLike []string) {
	for _, e := range pc.Tables {
		if e.Pattern() {
			schema, table := e.Split()
			schemaLike, tableLike = append(schemaLike, config.LikePattern(schema)), append(tableLike, config.LikePattern(table))
		}
	}
	return schemaLike, tableLike
}

// publishMatching adds to publication pc.Publication the tables the
// patterns of pc.Tables match that it does not publish (unpublished), and
// returns their names, quoted.
func publishMatching(ctx context.Context, tx pgx.Tx, pc config.Postgres) ([]string, error) {
	names, err := unpublished(ctx, tx, pc)
	if err != nil || len(names) == 0 {
		return nil, err
	}
	if _, err := tx.Exec(ctx, "ALTER PUBLICATION "+pgx.Identifier{pc.Publication}.Sanitize()+" ADD TABLE "+strings.Join(names, ", ")); err != nil {
		return nil, fmt.Errorf("adding %s, which the patterns of postgres.tables match, to publication %q: %w", strings.Join(names, ", "), pc.Publication, err)
	}
	return names, nil
}

// ListedElsewhere returns, for the tables by their quoted names, those
// that a publication other than publication lists by name (FOR TABLE;
// not FOR ALL TABLES or TABLES IN SCHEMA), each as "table (publication
// a, b)": another deployment streams such a table, and once outboxd
// migrate has added it to publication too, both deliver its rows
// (review-fix59 S7).
func ListedElsewhere(ctx context.Context, q querier, publication string, quoted []string) ([]string, error) {
	if len(quoted) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, `SELECT format('%I.%I', n.nspname, c.relname) || ' (publication ' || string_agg(quote_ident(b.pubname), ', ' ORDER BY b.pubname) || ')'
		FROM pg_publication_rel r JOIN pg_publication b ON b.oid = r.prpubid
			JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE b.pubname <> $1 AND r.prrelid IN (SELECT to_regclass(x) FROM unnest($2::text[]) x)
		GROUP BY n.nspname, c.relname ORDER BY 1`, publication, quoted)
	if err != nil {
		return nil, fmt.Errorf("reading which other publications list %s: %w", strings.Join(quoted, ", "), err)
	}
	listed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading which other publications list %s: %w", strings.Join(quoted, ", "), err)
	}
	return listed, nil
}

// RefuseWhileStreaming refuses, before outboxd migrate changes anything,
// to change what the deployment of pc publishes while an outboxd streams
// its slot (review-fix59 M1): to record patterns for pc.Publication other
// than those recorded, or to add tables to it. An outboxd of the
// configuration from before would pass over the rows of a table it does
// not list once the table is published ("ignoring the changes to …"),
// and confirm past them, or stop at the changed trigger. The slots are
// pc.Slot and, for postgres.shards > 1, every shard slot of it
// (shard.Parse), of any shard count. A rerun with the recorded patterns
// and nothing to add (an upgrade) goes through.
func RefuseWhileStreaming(ctx context.Context, q querier, pc config.Postgres) error {
	want := patternNames(pc)
	recorded, err := RecordedPatterns(ctx, q, pc.Publication)
	if err != nil {
		return err
	}
	var add []string
	if len(want) > 0 {
		if add, err = unpublished(ctx, q, pc); err != nil {
			return err
		}
	}
	// By bytes: the database's collation may order them otherwise.
	changed := !slices.Equal(slices.Sorted(slices.Values(want)), slices.Sorted(slices.Values(recorded)))
	if !changed && len(add) == 0 {
		return nil
	}
	active, err := activeSlots(ctx, q, pc.Slot)
	if err != nil || len(active) == 0 {
		return err
	}
	var would []string
	if len(add) > 0 {
		would = append(would, fmt.Sprintf("add %s, which the patterns of postgres.tables match, to publication %q", strings.Join(add, ", "), pc.Publication))
	}
	switch {
	case changed && len(want) == 0:
		would = append(would, fmt.Sprintf("delete the patterns %s recorded for publication %q, whose outboxd stops at the changed trigger", strings.Join(recorded, ", "), pc.Publication))
	case changed:
		would = append(would, fmt.Sprintf("record the patterns %s for publication %q in place of %s, after which the event trigger %s adds the tables they match to it as they are created",
			strings.Join(want, ", "), pc.Publication, orNone(recorded), TriggerName))
	}
	return fmt.Errorf("outboxd streams slot %s: stop it, run outboxd migrate, then start outboxd with this configuration. "+
		"Run now, migrate would %s; an outboxd whose configuration does not list a table passes over its rows once it is published (it logs \"ignoring the changes to …\") and confirms past them, "+
		"so they would never be delivered", strings.Join(active, ", "), strings.Join(would, ", and "))
}

// activeSlots returns the replication slots of this database that a
// walsender streams and that are slot or a shard slot of it, each as
// "name (pid N)".
func activeSlots(ctx context.Context, q querier, slot string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT slot_name::text, coalesce(active_pid, 0) FROM pg_replication_slots
		WHERE active AND database = current_database() ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("reading which replication slots an outboxd streams: %w", err)
	}
	var (
		name   string
		pid    int32
		active []string
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &pid}, func() error {
		if _, _, ok := shard.Parse(slot, name); ok {
			active = append(active, fmt.Sprintf("%s (pid %d)", name, pid))
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading which replication slots an outboxd streams: %w", err)
	}
	return active, nil
}

// ForgetPatterns deletes the patterns recorded for publication, for a
// configuration without a pattern (outboxd migrate), and returns them, and
// the tables they match that the publication publishes (matched), which
// stay in it: the caller says so (review-fix59 S5).
// Left there, the event trigger would go on adding the tables they match
// to the publication, and outboxd, which no longer lists them, would stop
// at their first row (review-patterns35 S2). Deleting needs a superuser
// (or the trigger's owner); it is refused, with what to run, only when
// there is something to delete.
func ForgetPatterns(ctx context.Context, conn *pgx.Conn, publication string) (patterns []string, matched []Match, err error) {
	if patterns, err = RecordedPatterns(ctx, conn, publication); err != nil || len(patterns) == 0 {
		return nil, nil, err
	}
	rows, err := conn.Query(ctx, `SELECT DISTINCT n.nspname::text, c.relname::text
		FROM `+PatternTable+` p, pg_publication_rel r JOIN pg_publication b ON b.oid = r.prpubid
			JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE p.publication = $1 AND b.pubname = $1 AND n.nspname LIKE p.schema_like AND c.relname LIKE p.table_like
		ORDER BY 1, 2`, publication)
	if err != nil {
		return nil, nil, fmt.Errorf("listing the tables of publication %q that the patterns recorded for it match: %w", publication, err)
	}
	var m Match
	if _, err = pgx.ForEachRow(rows, []any{&m.Schema, &m.Table}, func() error {
		matched = append(matched, m)
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("listing the tables of publication %q that the patterns recorded for it match: %w", publication, err)
	}
	if _, err := conn.Exec(ctx, `DELETE FROM `+PatternTable+` WHERE publication = $1`, publication); err != nil {
		return nil, nil, fmt.Errorf("deleting the patterns %s recorded in %s for publication %q, which postgres.tables no longer has (the event trigger %s would go on adding the tables they match to the publication, "+
			"and outboxd would stop at their first row): %w; run outboxd migrate with a superuser's postgres.dsn, or, as a superuser, DELETE FROM %s WHERE publication = %s",
			strings.Join(patterns, ", "), PatternTable, publication, TriggerName, err, PatternTable, quote.Literal(publication))
	}
	return patterns, matched, nil
}

// RecordedPatterns returns the patterns recorded for publication in
// PatternTable; none when outboxd migrate never installed the trigger.
func RecordedPatterns(ctx context.Context, q querier, publication string) ([]string, error) {
	var there bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, PatternTable).Scan(&there); err != nil || !there {
		return nil, err
	}
	var patterns []string
	if err := q.QueryRow(ctx, `SELECT coalesce(array_agg(pattern ORDER BY pattern), '{}') FROM `+PatternTable+` WHERE publication = $1`,
		publication).Scan(&patterns); err != nil {
		return nil, fmt.Errorf("reading the patterns recorded in %s for publication %q: %w", PatternTable, publication, err)
	}
	return patterns, nil
}

// querier is a connection or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ownersQuery lists TriggerSchema, what is in it, and the event trigger,
// each with its owner, where the owner is neither a superuser nor the role
// whose OID the SQL expression %s gives.
const ownersQuery = `SELECT o.what, r.rolname::text FROM (
		SELECT 'schema ' || quote_ident(n.nspname) AS what, n.nspowner AS owner FROM pg_namespace n WHERE n.nspname = $1
		UNION ALL SELECT 'relation ' || quote_ident(n.nspname) || '.' || quote_ident(c.relname), c.relowner
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1
		UNION ALL SELECT 'function ' || quote_ident(n.nspname) || '.' || quote_ident(p.proname) || '(' || pg_get_function_identity_arguments(p.oid) || ')', p.proowner
			FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1
		UNION ALL SELECT 'event trigger ' || quote_ident(t.evtname), t.evtowner FROM pg_event_trigger t WHERE t.evtname = $2
	) o JOIN pg_roles r ON r.oid = o.owner
	WHERE NOT r.rolsuper AND r.oid <> coalesce(%s, 0::oid) ORDER BY 1`

// checkOwners refuses TriggerSchema, anything in it, or the event
// trigger when a role owns it that is neither a superuser nor the role
// whose OID the SQL expression trusted gives ($2 is the trigger's name):
// the trigger's owner, who had to be a
// superuser to make it (or, on Amazon RDS, a member of rds_superuser), or
// the role installing it. Such a role could make the function run
// anything as every superuser that creates a table.
func checkOwners(ctx context.Context, q querier, trusted string) error {
	rows, err := q.Query(ctx, fmt.Sprintf(ownersQuery, trusted), TriggerSchema, TriggerName)
	if err != nil {
		return fmt.Errorf("reading the owners of schema %s and of the event trigger %s: %w", TriggerSchema, TriggerName, err)
	}
	var what, owner string
	var bad []string
	if _, err := pgx.ForEachRow(rows, []any{&what, &owner}, func() error {
		bad = append(bad, what+" belongs to role "+owner)
		return nil
	}); err != nil {
		return fmt.Errorf("reading the owners of schema %s and of the event trigger %s: %w", TriggerSchema, TriggerName, err)
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("the event trigger %s runs its function, in schema %s, as that function's owner in every CREATE TABLE, a superuser's included, "+
		"so the schema, everything in it and the trigger must belong to a superuser or to the trigger's owner, but %s. "+
		"Whoever made them could run anything as a superuser: find out who did, and what they hold, before you go on. "+
		"Then drop them as a superuser (DROP EVENT TRIGGER IF EXISTS %s; DROP SCHEMA %s CASCADE, which also drops the recorded patterns) and run outboxd migrate as a superuser",
		TriggerName, TriggerSchema, strings.Join(bad, ", "), TriggerName, TriggerSchema)
}

// CheckTrigger checks that the event trigger is installed, enabled always,
// runs this outboxd's function on this outboxd's commands, belongs with
// its schema to a superuser or the trigger's owner (checkOwners), and
// knows exactly the patterns of pc.Tables for pc.Publication; each failure
// says what to run.
func CheckTrigger(ctx context.Context, q querier, pc config.Postgres) error {
	want := patternNames(pc)
	if len(want) == 0 {
		return nil
	}
	lead := triggerLead(pc, want)
	var st triggerState
	var recorded bool
	err := q.QueryRow(ctx, `SELECT t.evtenabled::text, t.evttags, n.nspname || '.' || p.proname, p.prosrc, coalesce(p.prosecdef, false),
			EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace pn ON pn.oid = c.relnamespace WHERE pn.nspname = $2 AND c.relname = $3)
		FROM (SELECT 1) one LEFT JOIN pg_event_trigger t ON t.evtname = $1
			LEFT JOIN pg_proc p ON p.oid = t.evtfoid LEFT JOIN pg_namespace n ON n.oid = p.pronamespace`,
		TriggerName, TriggerSchema, strings.TrimPrefix(PatternTable, TriggerSchema+".")).Scan(&st.enabled, &st.tags, &st.fn, &st.body, &st.definer, &recorded)
	if err == nil && recorded {
		err = q.QueryRow(ctx, `SELECT coalesce(array_agg(pattern ORDER BY pattern), '{}') FROM `+PatternTable+` WHERE publication = $1`,
			pc.Publication).Scan(&st.patterns)
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return fmt.Errorf("%sreading %s: %w; run outboxd migrate as a superuser, which grants USAGE on schema %s and SELECT on the table to every role", lead, PatternTable, err, TriggerSchema)
		}
		return fmt.Errorf("reading the event trigger %s: %w", TriggerName, err)
	}
	if err := st.judgeFunc(lead); err != nil {
		return err
	}
	if err := checkOwners(ctx, q, "(SELECT evtowner FROM pg_event_trigger WHERE evtname = $2)"); err != nil {
		return fmt.Errorf("%s%w", lead, err)
	}
	return st.judge(lead, want)
}

// patternNames are the patterns of pc.Tables.
func patternNames(pc config.Postgres) []string {
	var want []string
	for _, e := range pc.Tables {
		if e.Pattern() {
			want = append(want, e.Name)
		}
	}
	return want
}

func triggerLead(pc config.Postgres, want []string) string {
	return fmt.Sprintf("postgres.tables has the pattern %s, whose tables created while outboxd runs are added to publication %q by the event trigger %s in the transaction that creates them; ",
		strings.Join(want, ", "), pc.Publication, TriggerName)
}

// triggerState is what the catalogue says of the event trigger: its
// evtenabled and tags, the name, body and SECURITY DEFINER of its
// function (nil when there is no trigger), and the patterns recorded for
// the publication.
type triggerState struct {
	enabled, fn, body *string
	tags, patterns    []string
	definer           bool
}

const migrateRemedy = "run outboxd migrate as a superuser (CREATE EVENT TRIGGER needs one) with this configuration"

// judgeFunc finds a trigger missing or running another function.
func (st triggerState) judgeFunc(lead string) error {
	switch {
	case st.enabled == nil:
		return fmt.Errorf("%sthat trigger is missing, and without it the rows of a new table are never delivered: %s, then start outboxd", lead, migrateRemedy)
	case st.fn == nil || *st.fn != triggerFunc:
		return fmt.Errorf("%sthat trigger runs the function %s, not %s, which outboxd migrate installs: %s", lead, orNone(deref(st.fn)), triggerFunc, migrateRemedy)
	}
	return nil
}

// judge finds, in a trigger that runs this outboxd's function, another
// body, a disabled trigger or one not enabled always, other commands, or
// patterns recorded other than want.
func (st triggerState) judge(lead string, want []string) error {
	switch {
	case st.body == nil || *st.body != triggerBody || !st.definer:
		return fmt.Errorf("%sits function %s is not the one this outboxd installs (an earlier outboxd installed it, or it was changed): %s", lead, triggerFunc, migrateRemedy)
	case *st.enabled == "D":
		return fmt.Errorf("%sthat trigger is disabled, and without it the rows of a new table are never delivered: run ALTER EVENT TRIGGER %s ENABLE ALWAYS as a superuser", lead, TriggerName)
	case *st.enabled != "A":
		return fmt.Errorf("%sthat trigger is not enabled always, so it does not fire under session_replication_role = replica (pg_restore, logical replication) and such a table's rows are never delivered: "+
			"run ALTER EVENT TRIGGER %s ENABLE ALWAYS as a superuser", lead, TriggerName)
	}
	tags := slices.Clone(st.tags)
	wantTags := slices.Sorted(slices.Values(triggerTags))
	slices.Sort(tags)
	if !slices.Equal(tags, wantTags) {
		return fmt.Errorf("%sthat trigger fires on %s, not on %s as this outboxd's does (an earlier outboxd installed it), and a table made otherwise is not published: %s",
			lead, orNone(tags), strings.Join(wantTags, ", "), migrateRemedy)
	}
	want = slices.Sorted(slices.Values(want))
	have := slices.Sorted(slices.Values(st.patterns)) // by bytes, as want: the database's collation may order them otherwise
	if !slices.Equal(want, have) {
		return fmt.Errorf("%sthe trigger knows the patterns %s for it (in %s), not these: %s", lead, orNone(have), PatternTable, migrateRemedy)
	}
	return nil
}

// watchQuery reads, in one query, the event trigger as CheckTrigger does
// (without the owners), the patterns recorded for the publication ($2),
// whether the publication exists, and the tables that the patterns whose
// LIKE forms are $3 and $4 match (outboxKinds, as MatchTables) and that
// the publication does not publish. A table created by a transaction
// still open is not visible to it, and so not found.
const watchQuery = `WITH pub AS (SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $2)
	SELECT t.evtenabled::text, t.evttags, pn.nspname || '.' || p.proname, p.prosrc, coalesce(p.prosecdef, false),
		(SELECT coalesce(array_agg(r.pattern ORDER BY r.pattern), '{}') FROM ` + PatternTable + ` r WHERE r.publication = $2),
		EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $2), u.schemas, u.names
	FROM (SELECT 1) one LEFT JOIN pg_event_trigger t ON t.evtname = $1
		LEFT JOIN pg_proc p ON p.oid = t.evtfoid LEFT JOIN pg_namespace pn ON pn.oid = p.pronamespace,
		LATERAL (SELECT coalesce(array_agg(n.nspname::text ORDER BY n.nspname, c.relname), '{}') AS schemas,
				coalesce(array_agg(c.relname::text ORDER BY n.nspname, c.relname), '{}') AS names
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE ` + outboxKinds + `
				AND EXISTS (SELECT 1 FROM unnest($3::text[], $4::text[]) l(s, t) WHERE n.nspname LIKE l.s AND c.relname LIKE l.t)
				AND NOT EXISTS (SELECT 1 FROM pub WHERE pub.schemaname = n.nspname AND pub.tablename = c.relname)) u`

// WatchPatterns reads the catalogue once, while outboxd streams, for the
// patterns of pc.Tables: it returns the tables they match (each the
// pattern's by config.Postgres.EntryOf) that publication pc.Publication
// does not publish, none when the publication is gone (the stream reports
// that), and trigger, the event trigger found missing, disabled, not
// enabled always, changed, or knowing other patterns, with what to run,
// as CheckTrigger says it at start-up (its owners are left to the next
// start). err is a failed read. With no pattern it reads nothing.
func WatchPatterns(ctx context.Context, q querier, pc config.Postgres) (unpublished []Match, trigger, err error) {
	want := patternNames(pc)
	if len(want) == 0 {
		return nil, nil, nil
	}
	schemaLike, tableLike := likeForms(pc)
	lead := triggerLead(pc, want)
	var st triggerState
	var pubExists bool
	var schemas, names []string
	err = q.QueryRow(ctx, watchQuery, TriggerName, pc.Publication, schemaLike, tableLike).
		Scan(&st.enabled, &st.tags, &st.fn, &st.body, &st.definer, &st.patterns, &pubExists, &schemas, &names)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // the pattern table is gone, with its schema
		return nil, fmt.Errorf("%sthe table %s, which it reads, is missing, and so is the trigger or its function: %s, then start outboxd", lead, PatternTable, migrateRemedy), nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the event trigger %s and the tables the patterns of postgres.tables match: %w", TriggerName, err)
	}
	if trigger = st.judgeFunc(lead); trigger == nil {
		trigger = st.judge(lead, want)
	}
	if !pubExists {
		return nil, trigger, nil
	}
	for i := range schemas {
		// LIKE compares by the database's collation; Matches exactly.
		if j, ok := pc.EntryOf(schemas[i], names[i]); ok && pc.Tables[j].Pattern() && pc.Tables[j].Matches(schemas[i], names[i]) {
			unpublished = append(unpublished, Match{Schema: schemas[i], Table: names[i], Entry: j})
		}
	}
	return unpublished, trigger, nil
}

func deref(s *string) []string {
	if s == nil {
		return nil
	}
	return []string{*s}
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
