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
)

// The event trigger that adds a table a pattern of postgres.tables matches
// to the publication in the transaction that creates it (DESIGN.md,
// "Tables created while outboxd runs"). The patterns it knows are the rows
// of PatternTable, one per publication and pattern, written by outboxd
// migrate (InstallTrigger): one trigger serves every outboxd of the
// database, and outboxd reads the rows at start-up to check that they are
// its patterns.
const (
	TriggerName  = "outboxd_add_tables"
	PatternTable = "public.outboxd_table_patterns"
	triggerFunc  = "public.outboxd_add_tables"
)

// triggerTags are the commands the trigger fires on. CREATE SCHEMA fires
// it once for the schema and the tables its own CREATE TABLE elements make
// (they fire no event of their own); ALTER SCHEMA for a schema renamed
// into a matching name with its tables.
var triggerTags = []string{"CREATE TABLE", "CREATE TABLE AS", "SELECT INTO", "ALTER TABLE", "CREATE SCHEMA", "ALTER SCHEMA"}

// triggerSQL installs the pattern table, the trigger's function and the
// trigger, idempotently. The function is SECURITY DEFINER, owned by the
// superuser who runs migrate, for ALTER PUBLICATION … ADD TABLE needs
// ownership of the table and the publication. It skips a publication
// that does not exist yet (outboxd creates it FOR TABLE the tables the
// patterns match). It refuses, aborting the transaction, a matching table
// made with its rows already in it (CREATE TABLE AS, SELECT INTO) and a
// table renamed or moved into a matching name, itself (ALTER TABLE) or by
// its schema (ALTER SCHEMA … RENAME): their rows, or some of them, would
// never be published. A table made by CREATE SCHEMA's own CREATE TABLE is
// added as one made by CREATE TABLE alone: the event fires once, for
// CREATE SCHEMA, and lists the table's CREATE TABLE among its commands.
// It looks at the tables a pattern matches at start-up (pg.MatchTables):
// partitions are left out, for their parent publishes them
// (publish_via_partition_root), and so are temporary and unlogged tables,
// which Postgres cannot publish, and tables of the system schemas.
var triggerSQL = []string{
	`CREATE TABLE IF NOT EXISTS ` + PatternTable + ` (
		publication text NOT NULL,
		pattern text NOT NULL,
		schema_like text NOT NULL,
		table_like text NOT NULL,
		PRIMARY KEY (publication, pattern))`,
	`REVOKE ALL ON ` + PatternTable + ` FROM PUBLIC`,
	`GRANT SELECT ON ` + PatternTable + ` TO PUBLIC`,
	`CREATE OR REPLACE FUNCTION ` + triggerFunc + `() RETURNS event_trigger
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
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
		FOR m IN SELECT DISTINCT ON (p.publication, c.oid) p.publication, p.pattern, n.nspname::text AS nspname, c.relname::text AS relname
			FROM ` + PatternTable + ` p, pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE CASE WHEN cmd.object_type = 'schema' THEN c.relnamespace ELSE c.oid END = cmd.objid
				AND ` + outboxKinds + ` AND ` + persistent + `
				AND n.nspname LIKE p.schema_like AND c.relname LIKE p.table_like
				AND EXISTS (SELECT 1 FROM pg_publication b WHERE b.pubname = p.publication)
				AND NOT EXISTS (SELECT 1 FROM pg_publication_rel r JOIN pg_publication b ON b.oid = r.prpubid
					WHERE b.pubname = p.publication AND r.prrelid = c.oid)
			ORDER BY p.publication, c.oid, p.pattern
		LOOP
			IF cmd.command_tag = 'CREATE TABLE' THEN
				EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I.%I', m.publication, m.nspname, m.relname);
			ELSE
				RAISE EXCEPTION 'outboxd: %.% matches the outbox table pattern % of publication %, which does not publish it', m.nspname, m.relname, m.pattern, m.publication
					USING DETAIL = cmd.command_tag || ' made or changed it while the publication does not publish it: rows written to it before would never be delivered (CREATE TABLE AS and SELECT INTO write rows before the table can be published; a table renamed or moved into a matching name, itself or by its schema, was not published when its rows were written)',
						HINT = format('create a table with CREATE TABLE and then INSERT; for an existing table, run ALTER PUBLICATION %I ADD TABLE first (its rows written before are not delivered: send them with outboxd replay), or give it a name the pattern does not match', m.publication);
			END IF;
		END LOOP;
	END LOOP;
END
$fn$`,
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
func InstallTrigger(ctx context.Context, conn *pgx.Conn, pc config.Postgres) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	for _, q := range triggerSQL {
		if _, err := tx.Exec(ctx, q); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42501" {
				return fmt.Errorf("installing the event trigger %s, which adds the tables a pattern of postgres.tables matches to publication %q as they are created: %w; "+
					"it needs a superuser (CREATE EVENT TRIGGER): run outboxd migrate with a superuser's postgres.dsn (outboxd itself runs with the least-privilege role)", TriggerName, pc.Publication, err)
			}
			return fmt.Errorf("installing the event trigger %s: %w", TriggerName, err)
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+PatternTable+` WHERE publication = $1`, pc.Publication); err != nil {
		return fmt.Errorf("recording the patterns of postgres.tables: %w", err)
	}
	for _, e := range pc.Tables {
		if !e.Pattern() {
			continue
		}
		schema, table := e.Split()
		if _, err := tx.Exec(ctx, `INSERT INTO `+PatternTable+` VALUES ($1, $2, $3, $4)`,
			pc.Publication, e.Name, config.LikePattern(schema), config.LikePattern(table)); err != nil {
			return fmt.Errorf("recording the pattern %s of postgres.tables: %w", e.Name, err)
		}
	}
	return tx.Commit(ctx)
}

// CheckTrigger checks that the event trigger is installed, enabled always,
// and knows exactly the patterns of pc.Tables for pc.Publication; each
// failure says what to run.
func CheckTrigger(ctx context.Context, conn *pgx.Conn, pc config.Postgres) error {
	var want []string
	for _, e := range pc.Tables {
		if e.Pattern() {
			want = append(want, e.Name)
		}
	}
	if len(want) == 0 {
		return nil
	}
	lead := fmt.Sprintf("postgres.tables has the pattern %s, whose tables created while outboxd runs are added to publication %q by the event trigger %s in the transaction that creates them; ",
		strings.Join(want, ", "), pc.Publication, TriggerName)
	var enabled *string
	var have, tags []string
	var recorded bool
	err := conn.QueryRow(ctx, `SELECT (SELECT evtenabled::text FROM pg_event_trigger WHERE evtname = $1),
			(SELECT evttags FROM pg_event_trigger WHERE evtname = $1), to_regclass($2) IS NOT NULL`,
		TriggerName, PatternTable).Scan(&enabled, &tags, &recorded)
	if err == nil && recorded {
		err = conn.QueryRow(ctx, `SELECT coalesce(array_agg(pattern ORDER BY pattern), '{}') FROM `+PatternTable+` WHERE publication = $1`,
			pc.Publication).Scan(&have)
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return fmt.Errorf("%sreading %s: %w; run outboxd migrate as a superuser, which grants SELECT on it to every role", lead, PatternTable, err)
		}
		return fmt.Errorf("reading the event trigger %s: %w", TriggerName, err)
	}
	switch {
	case enabled == nil:
		return fmt.Errorf("%sthat trigger is missing, and without it the rows of a new table are never delivered: run outboxd migrate as a superuser (CREATE EVENT TRIGGER needs one) with this configuration, then start outboxd", lead)
	case *enabled == "D":
		return fmt.Errorf("%sthat trigger is disabled, and without it the rows of a new table are never delivered: run ALTER EVENT TRIGGER %s ENABLE ALWAYS as a superuser", lead, TriggerName)
	case *enabled != "A":
		return fmt.Errorf("%sthat trigger is not enabled always, so it does not fire under session_replication_role = replica (pg_restore, logical replication) and such a table's rows are never delivered: "+
			"run ALTER EVENT TRIGGER %s ENABLE ALWAYS as a superuser", lead, TriggerName)
	}
	wantTags := slices.Sorted(slices.Values(triggerTags))
	slices.Sort(tags)
	if !slices.Equal(tags, wantTags) {
		return fmt.Errorf("%sthat trigger fires on %s, not on %s as this outboxd's does (an earlier outboxd installed it), and a table made otherwise is not published: "+
			"run outboxd migrate as a superuser with this configuration", lead, orNone(tags), strings.Join(wantTags, ", "))
	}
	slices.Sort(want)
	if !slices.Equal(want, have) {
		return fmt.Errorf("%sthe trigger knows the patterns %s for it (in %s), not these: run outboxd migrate as a superuser with this configuration",
			lead, orNone(have), PatternTable)
	}
	return nil
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
