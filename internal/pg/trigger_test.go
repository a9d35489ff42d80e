package pg

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/testenv"
)

// triggerDB returns a connection to a new database of the test bed with
// publication pub and the event trigger installed for the patterns
// (postgres.tables) names.
func triggerDB(t *testing.T, names ...string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	_, conn := newDatabase(t, "trigger")
	if _, err := conn.Exec(ctx, `CREATE PUBLICATION pub`); err != nil {
		t.Fatal(err)
	}
	if _, err := InstallTrigger(ctx, conn, triggerConfig(names...)); err != nil {
		t.Fatalf("InstallTrigger: %v", err)
	}
	return conn
}

func triggerConfig(names ...string) config.Postgres {
	pc := config.Postgres{Publication: "pub"}
	for _, n := range names {
		pc.Tables = append(pc.Tables, config.TableEntry{Name: n})
	}
	return pc
}

// published returns the tables publication pub publishes, sorted.
func published(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var names []string
	err := conn.QueryRow(context.Background(), `SELECT coalesce(array_agg(schemaname || '.' || tablename ORDER BY schemaname, tablename), '{}')
		FROM pg_publication_tables WHERE pubname = 'pub'`).Scan(&names)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(names, ",")
}

// anotherConn returns a second connection to conn's database, closed at
// the test's end.
func anotherConn(t *testing.T, conn *pgx.Conn) *pgx.Conn {
	t.Helper()
	other, err := pgx.Connect(context.Background(), conn.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close(context.Background()) })
	return other
}

// execs runs each statement in a transaction of its own and returns the
// first error.
func execs(conn *pgx.Conn, stmts ...string) error {
	for _, q := range stmts {
		if _, err := conn.Exec(context.Background(), q); err != nil {
			return err
		}
	}
	return nil
}

// A table CREATE SCHEMA makes with its own CREATE TABLE is published as
// one CREATE TABLE makes alone; a schema renamed into a matching name with
// a table the publication does not publish is refused (review M1).
func TestTriggerCreateSchema(t *testing.T) {
	conn := triggerDB(t, "tenant_*.events")
	if err := execs(conn, `CREATE SCHEMA tenant_q CREATE TABLE events (id int) CREATE TABLE other (id int)`); err != nil {
		t.Fatalf("CREATE SCHEMA … CREATE TABLE: %v", err)
	}
	if got := published(t, conn); got != "tenant_q.events" {
		t.Fatalf("published after CREATE SCHEMA tenant_q CREATE TABLE events: %q, want tenant_q.events", got)
	}
	if err := execs(conn, `CREATE SCHEMA staging_r`, `CREATE TABLE staging_r.events (id int)`); err != nil {
		t.Fatal(err)
	}
	err := execs(conn, `ALTER SCHEMA staging_r RENAME TO tenant_r`)
	if err == nil || !strings.Contains(err.Error(), "tenant_r.events matches the outbox table pattern tenant_*.events of publication pub, which does not publish it") {
		t.Fatalf("ALTER SCHEMA … RENAME into a matching name: %v, want the trigger's refusal", err)
	}
	// Renaming the schema of published tables is left alone, and so is a
	// schema whose tables the patterns do not match.
	if err := execs(conn, `ALTER SCHEMA tenant_q RENAME TO tenant_q2`, `CREATE SCHEMA staging_s`, `CREATE TABLE staging_s.log (id int)`,
		`ALTER SCHEMA staging_s RENAME TO tenant_s`); err != nil {
		t.Fatalf("renaming schemas the trigger has nothing against: %v", err)
	}
	if got := published(t, conn); got != "tenant_q2.events" {
		t.Fatalf("published: %q, want tenant_q2.events", got)
	}
}

// Two patterns of one publication that match one new table: the table is
// added once, and the CREATE TABLE goes through (review-patterns35 M2).
func TestTriggerOverlappingPatterns(t *testing.T) {
	conn := triggerDB(t, "tenant_*.events", "*.events")
	if err := execs(conn, `CREATE SCHEMA tenant_z`, `CREATE TABLE tenant_z.events (id int)`, `CREATE SCHEMA shop`, `CREATE TABLE shop.events (id int)`); err != nil {
		t.Fatalf("CREATE TABLE of a table two patterns match: %v", err)
	}
	if got := published(t, conn); got != "shop.events,tenant_z.events" {
		t.Fatalf("published: %q, want shop.events,tenant_z.events", got)
	}
}

// A temporary table of a matching name is no outbox table: its CREATE
// succeeds and it is not published (review-patterns35 M3). An unlogged one
// is refused, made so or changed, even before the publication exists:
// Postgres writes no WAL for its rows, which would never be delivered
// (review-eosbf MF1).
func TestTriggerSkipsTemporaryRefusesUnlogged(t *testing.T) {
	conn := triggerDB(t, "*.outbox")
	if err := execs(conn, `CREATE TEMP TABLE outbox (id int)`, `ALTER TABLE outbox ADD COLUMN at date`, `CREATE SCHEMA scratch`, `CREATE TABLE scratch.outbox2 (id int)`); err != nil {
		t.Fatalf("a temporary table of a matching name: %v", err)
	}
	if got := published(t, conn); got != "" {
		t.Fatalf("published: %q, want none", got)
	}
	const refused = "scratch.outbox matches the outbox table pattern *.outbox of publication pub, but is UNLOGGED"
	for _, stmts := range [][]string{
		{`CREATE UNLOGGED TABLE scratch.outbox (id int)`},
		{`CREATE UNLOGGED TABLE scratch.outbox_u (id int)`, `ALTER TABLE scratch.outbox_u RENAME TO outbox`},
		{`CREATE UNLOGGED TABLE scratch.outbox_u (id int)`, `ALTER TABLE scratch.outbox_u SET SCHEMA public`, `ALTER TABLE public.outbox_u RENAME TO outbox`},
		{`CREATE SCHEMA scratch2 CREATE UNLOGGED TABLE outbox (id int)`},
	} {
		err := execs(conn, append([]string{`DROP TABLE IF EXISTS scratch.outbox_u, public.outbox_u`, `DROP SCHEMA IF EXISTS scratch2 CASCADE`}, stmts...)...)
		if err == nil || (!strings.Contains(err.Error(), refused) && !strings.Contains(err.Error(), "outbox matches the outbox table pattern *.outbox of publication pub, but is UNLOGGED")) {
			t.Errorf("%s: %v; want the trigger's refusal of an unlogged table", strings.Join(stmts, "; "), err)
		}
	}
	// Postgres itself refuses SET UNLOGGED of a published table.
	if err := execs(conn, `CREATE SCHEMA shop`, `CREATE TABLE shop.outbox (id int)`); err != nil {
		t.Fatal(err)
	}
	if got := published(t, conn); got != "shop.outbox" {
		t.Fatalf("published: %q, want shop.outbox", got)
	}
	if err := execs(conn, `ALTER TABLE shop.outbox SET UNLOGGED`); err == nil {
		t.Errorf("ALTER TABLE … SET UNLOGGED of a published table went through")
	}
	// One made while the trigger was not there (or an earlier one skipped
	// it) is refused at start-up, with statements that make it logged and
	// published.
	if err := execs(conn, `ALTER EVENT TRIGGER `+TriggerName+` DISABLE`, `CREATE SCHEMA tenant_old`, `CREATE UNLOGGED TABLE tenant_old.outbox (id int)`,
		`ALTER EVENT TRIGGER `+TriggerName+` ENABLE ALWAYS`); err != nil {
		t.Fatal(err)
	}
	_, err := MatchTables(context.Background(), conn, triggerConfig("*.outbox").Tables)
	var ue *UnloggedError
	if !errors.As(err, &ue) || ue.Name() != "tenant_old.outbox" {
		t.Fatalf("MatchTables with tenant_old.outbox unlogged: %v; want an *UnloggedError naming it", err)
	}
	fix := remedyOf(t, err)
	if _, err := conn.Exec(context.Background(), fix); err != nil {
		t.Fatalf("the statements the refusal gives (%s): %v", fix, err)
	}
	if got := published(t, conn); got != "shop.outbox,tenant_old.outbox" {
		t.Fatalf("published after %s: %q, want shop.outbox,tenant_old.outbox", fix, got)
	}
	if err := CheckTrigger(context.Background(), conn, triggerConfig("*.outbox")); err != nil {
		t.Fatalf("CheckTrigger after %s: %v", fix, err)
	}
	// Before the publication exists, too.
	if err := execs(conn, `DROP PUBLICATION pub`); err != nil {
		t.Fatal(err)
	}
	if err := execs(conn, `CREATE UNLOGGED TABLE scratch.outbox (id int)`); err == nil || !strings.Contains(err.Error(), refused) {
		t.Errorf("CREATE UNLOGGED TABLE before the publication exists: %v; want the trigger's refusal", err)
	}
}

// An UNLOGGED partition of a table a pattern matches is refused, made so,
// attached or changed, whether or not the publication exists: the root's
// publication publishes none of its rows (review-fix55 Must 1). Start-up
// and the periodic check find one made while the trigger was off
// (RefuseUnlogged), and SET LOGGED, which the trigger lets through, puts
// it right.
func TestTriggerRefusesUnloggedPartition(t *testing.T) {
	ctx := context.Background()
	conn := triggerDB(t, "sho*.ev")
	if err := execs(conn, `ALTER PUBLICATION pub SET (publish_via_partition_root = true)`, `CREATE SCHEMA shop`, `CREATE SCHEMA scratch`,
		`CREATE TABLE shop.ev (id int, at date) PARTITION BY RANGE (at)`,
		`CREATE TABLE shop.ev_2026 PARTITION OF shop.ev FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`,
		`CREATE TABLE shop.ev_2028 PARTITION OF shop.ev FOR VALUES FROM ('2028-01-01') TO ('2029-01-01') PARTITION BY RANGE (id)`); err != nil {
		t.Fatal(err)
	}
	if got := published(t, conn); got != "shop.ev" {
		t.Fatalf("published: %q, want shop.ev", got)
	}
	for _, stmts := range [][]string{
		{`CREATE UNLOGGED TABLE shop.ev_2027 PARTITION OF shop.ev FOR VALUES FROM ('2027-01-01') TO ('2028-01-01')`},
		{`CREATE UNLOGGED TABLE scratch.p (id int, at date)`, `ALTER TABLE shop.ev ATTACH PARTITION scratch.p FOR VALUES FROM ('2027-01-01') TO ('2028-01-01')`},
		{`ALTER TABLE shop.ev_2026 SET UNLOGGED`},
		{`CREATE UNLOGGED TABLE scratch.ev_2028_low PARTITION OF shop.ev_2028 FOR VALUES FROM (0) TO (100)`},
	} {
		err := execs(conn, append([]string{`DROP TABLE IF EXISTS scratch.p`}, stmts...)...)
		if err == nil || !strings.Contains(err.Error(), "shop.ev matches the outbox table pattern sho*.ev of publication pub, but its partition") ||
			!strings.Contains(err.Error(), "is UNLOGGED") {
			t.Errorf("%s: %v; want the trigger's refusal of an unlogged partition", strings.Join(stmts, "; "), err)
		}
	}
	// A logged partition, and an unlogged table elsewhere, go through.
	if err := execs(conn, `DROP TABLE IF EXISTS scratch.p`, `CREATE TABLE shop.ev_2027 PARTITION OF shop.ev FOR VALUES FROM ('2027-01-01') TO ('2028-01-01')`,
		`CREATE UNLOGGED TABLE scratch.p (id int, at date)`); err != nil {
		t.Fatalf("a logged partition, an unlogged table of no pattern: %v", err)
	}
	quoted, shown := []string{`"shop"."ev"`}, []string{"shop.ev"}
	if err := RefuseUnlogged(ctx, conn, quoted, shown); err != nil {
		t.Fatalf("RefuseUnlogged with every partition logged: %v", err)
	}
	// One made while the trigger was off is refused by RefuseUnlogged,
	// and the SET LOGGED it gives goes through the trigger.
	if err := execs(conn, `ALTER EVENT TRIGGER `+TriggerName+` DISABLE`, `ALTER TABLE shop.ev_2026 SET UNLOGGED`,
		`ALTER EVENT TRIGGER `+TriggerName+` ENABLE ALWAYS`); err != nil {
		t.Fatal(err)
	}
	err := RefuseUnlogged(ctx, conn, quoted, shown)
	var ue *UnloggedPartitionError
	if !errors.As(err, &ue) || ue.Partition != "shop.ev_2026" || ue.Table != "shop.ev" ||
		!strings.Contains(err.Error(), "ALTER TABLE shop.ev_2026 SET LOGGED") || !strings.Contains(err.Error(), "outboxd replay -table shop.ev") {
		t.Fatalf("RefuseUnlogged with shop.ev_2026 unlogged: %v; want an *UnloggedPartitionError naming it, SET LOGGED and replay", err)
	}
	if err := execs(conn, `ALTER TABLE shop.ev_2026 SET LOGGED`); err != nil {
		t.Fatalf("SET LOGGED of the partition: %v", err)
	}
	if err := RefuseUnlogged(ctx, conn, quoted, shown); err != nil {
		t.Fatalf("RefuseUnlogged after SET LOGGED: %v", err)
	}
	// Before the publication exists, too.
	if err := execs(conn, `DROP PUBLICATION pub`); err != nil {
		t.Fatal(err)
	}
	if err := execs(conn, `ALTER TABLE shop.ev_2027 SET UNLOGGED`); err == nil || !strings.Contains(err.Error(), "but its partition shop.ev_2027 is UNLOGGED") {
		t.Errorf("SET UNLOGGED of a partition before the publication exists: %v; want the trigger's refusal", err)
	}
}

// The trigger's schema, function and table must belong to a superuser or
// the trigger's owner: migrate refuses a schema another role made first
// (its function would run as every superuser that creates a table), and
// the start-up check refuses a function given away, a trigger that runs
// another function, a changed function, and a trigger of other commands
// (review-patterns35 M4).
func TestTriggerOwners(t *testing.T) {
	ctx := context.Background()
	db, conn := newDatabase(t, "owners")
	squat := "squat_" + testenv.RandomSuffix()
	t.Cleanup(func() { // before the connection closes
		_, _ = conn.Exec(context.Background(), `RESET ROLE; DROP OWNED BY `+squat+`; DROP ROLE IF EXISTS `+squat)
	})
	pc := triggerConfig("tenant_*.events")
	if err := execs(conn, `CREATE PUBLICATION pub`, `CREATE ROLE `+squat+` NOLOGIN`, `GRANT CREATE ON DATABASE `+db+` TO `+squat,
		`SET ROLE `+squat, `CREATE SCHEMA `+TriggerSchema, `RESET ROLE`,
		`CREATE FUNCTION `+triggerFunc+`() RETURNS event_trigger LANGUAGE plpgsql AS $$BEGIN RAISE NOTICE 'squatted'; END$$`,
		`ALTER FUNCTION `+triggerFunc+`() OWNER TO `+squat); err != nil {
		t.Fatal(err)
	}
	_, err := InstallTrigger(ctx, conn, pc)
	if err == nil || !strings.Contains(err.Error(), "function outboxd_trigger.add_tables() belongs to role "+squat+", schema outboxd_trigger belongs to role "+squat) {
		t.Fatalf("InstallTrigger over a squatted schema: %v, want a refusal naming the squatter's objects", err)
	}
	var triggers int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_event_trigger WHERE evtname = $1`, TriggerName).Scan(&triggers); err != nil || triggers != 0 {
		t.Fatalf("event triggers after the refusal: %d, %v; want none", triggers, err)
	}
	if err := execs(conn, `DROP SCHEMA `+TriggerSchema+` CASCADE`); err != nil {
		t.Fatal(err)
	}
	if _, err := InstallTrigger(ctx, conn, pc); err != nil {
		t.Fatalf("InstallTrigger: %v", err)
	}
	if err := CheckTrigger(ctx, conn, pc); err != nil {
		t.Fatalf("CheckTrigger after InstallTrigger: %v", err)
	}
	for _, tc := range []struct {
		name  string
		stmts []string
		want  string
	}{
		{"function given away", []string{`ALTER FUNCTION ` + triggerFunc + `() OWNER TO ` + squat},
			"function outboxd_trigger.add_tables() belongs to role " + squat},
		{"pattern table given away", []string{`ALTER TABLE ` + PatternTable + ` OWNER TO ` + squat},
			"relation outboxd_trigger.patterns belongs to role " + squat},
		{"another function", []string{`CREATE FUNCTION public.other() RETURNS event_trigger LANGUAGE plpgsql AS $$BEGIN END$$`,
			`DROP EVENT TRIGGER ` + TriggerName, `CREATE EVENT TRIGGER ` + TriggerName + ` ON ddl_command_end EXECUTE FUNCTION public.other()`,
			`ALTER EVENT TRIGGER ` + TriggerName + ` ENABLE ALWAYS`},
			"that trigger runs the function public.other, not outboxd_trigger.add_tables"},
		{"function changed", []string{`CREATE OR REPLACE FUNCTION ` + triggerFunc + `() RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER AS $$BEGIN END$$`},
			"its function outboxd_trigger.add_tables is not the one this outboxd installs"},
		{"other commands", []string{`DROP EVENT TRIGGER ` + TriggerName,
			`CREATE EVENT TRIGGER ` + TriggerName + ` ON ddl_command_end WHEN TAG IN ('CREATE TABLE') EXECUTE FUNCTION ` + triggerFunc + `()`,
			`ALTER EVENT TRIGGER ` + TriggerName + ` ENABLE ALWAYS`},
			"that trigger fires on CREATE TABLE, not on ALTER SCHEMA, ALTER TABLE, CREATE SCHEMA"},
	} {
		if err := execs(conn, tc.stmts...); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if err := CheckTrigger(ctx, conn, pc); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: CheckTrigger: %v, want %q", tc.name, err, tc.want)
		}
		// migrate puts it right, or refuses what another role holds.
		_, err := InstallTrigger(ctx, conn, pc)
		if strings.Contains(tc.name, "given away") {
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: InstallTrigger: %v, want %q", tc.name, err, tc.want)
			}
			if err := execs(conn, `DROP EVENT TRIGGER IF EXISTS `+TriggerName, `DROP SCHEMA `+TriggerSchema+` CASCADE`); err != nil {
				t.Fatal(err)
			}
			_, err = InstallTrigger(ctx, conn, pc)
		}
		if err != nil {
			t.Fatalf("%s: InstallTrigger: %v", tc.name, err)
		}
		if err := CheckTrigger(ctx, conn, pc); err != nil {
			t.Fatalf("%s: CheckTrigger after InstallTrigger: %v", tc.name, err)
		}
	}
}

// newDatabase makes a database of the test bed, named after name, and
// returns its name and a connection to it, closed when the test ends.
func newDatabase(t *testing.T, name string) (string, *pgx.Conn) {
	t.Helper()
	db, dsn := testenv.NewDatabase(t, name)
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return db, conn
}

// WatchPatterns, the check while outboxd streams (review-patterns35 S1):
// nothing to say while the trigger publishes every new table; a trigger
// disabled, or not enabled always, or dropped, is said with what to run; a
// table the patterns match that the publication lacks is named, and one
// whose creating transaction is still open is not (it is not visible yet).
func TestWatchPatterns(t *testing.T) {
	ctx := context.Background()
	conn := triggerDB(t, "tenant_*.events")
	pc := triggerConfig("tenant_*.events")
	watch := func() (string, error) {
		t.Helper()
		un, trigger, err := WatchPatterns(ctx, conn, pc)
		if err != nil {
			t.Fatalf("WatchPatterns: %v", err)
		}
		return MatchNames(un), trigger
	}
	want := func(step, tables, trigger string) {
		t.Helper()
		got, err := watch()
		if got != tables || (trigger == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), trigger)) {
			t.Errorf("%s: unpublished %q, trigger %v; want %q and %q", step, got, err, tables, trigger)
		}
	}
	if err := execs(conn, `CREATE SCHEMA tenant_a`, `CREATE TABLE tenant_a.events (id int)`, `CREATE TABLE tenant_a.other (id int)`); err != nil {
		t.Fatal(err)
	}
	want("trigger as installed", "", "")
	if err := execs(conn, `ALTER EVENT TRIGGER `+TriggerName+` ENABLE`); err != nil {
		t.Fatal(err)
	}
	want("enabled, not always", "", "that trigger is not enabled always")
	if err := execs(conn, `ALTER EVENT TRIGGER `+TriggerName+` DISABLE`); err != nil {
		t.Fatal(err)
	}
	want("disabled", "", "that trigger is disabled, and without it the rows of a new table are never delivered: run ALTER EVENT TRIGGER outboxd_add_tables ENABLE ALWAYS")
	if err := execs(conn, `CREATE SCHEMA tenant_b`, `CREATE TABLE tenant_b.events (id int)`); err != nil {
		t.Fatal(err)
	}
	// Another connection creates a tenant and has not committed.
	tx, err := anotherConn(t, conn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA tenant_c; CREATE TABLE tenant_c.events (id int)`); err != nil {
		t.Fatal(err)
	}
	want("a tenant created while disabled, one being created", "tenant_b.events", "that trigger is disabled")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want("both committed", "tenant_b.events,tenant_c.events", "that trigger is disabled")
	if err := execs(conn, `DROP EVENT TRIGGER `+TriggerName, `ALTER PUBLICATION pub ADD TABLE tenant_b.events, tenant_c.events`); err != nil {
		t.Fatal(err)
	}
	want("dropped", "", "that trigger is missing")
	if err := execs(conn, `DROP SCHEMA `+TriggerSchema+` CASCADE`); err != nil {
		t.Fatal(err)
	}
	want("dropped with its schema", "", "the table outboxd_trigger.patterns, which it reads, is missing")
}

// remedyOf returns the BEGIN … COMMIT statements that err gives.
func remedyOf(t *testing.T, err error) string {
	t.Helper()
	return transactionIn(t, err.Error())
}

// transactionIn returns the BEGIN … COMMIT statements that msg gives.
func transactionIn(t *testing.T, msg string) string {
	t.Helper()
	i, j := strings.Index(msg, "BEGIN;"), strings.Index(msg, "; COMMIT")
	if i < 0 || j < i {
		t.Fatalf("%s: want statements from BEGIN to COMMIT", msg)
	}
	return msg[i : j+len("; COMMIT")]
}

// The statements that make an UNLOGGED outbox table logged depend on
// whether a pattern recorded for the event trigger matches it, not on the
// kind of the entry that names it (review-fix55 N1). Where one of an
// existing publication does, the trigger refuses SET LOGGED alone (the
// table would be a matching one the publication lacks, and an unlogged
// table cannot be published first): an exact name, in a configuration
// without a pattern (RefuseUnlogged) or beside one (MatchTables), gets the
// transaction with the trigger disabled and ADD TABLE, and it goes
// through. Where none does, SET LOGGED alone is given, and goes through.
func TestUnloggedRemedyByRecordedPattern(t *testing.T) {
	ctx := context.Background()
	conn := triggerDB(t, "*.outbox")
	if err := execs(conn, `ALTER EVENT TRIGGER `+TriggerName+` DISABLE`, `CREATE SCHEMA shop`, `CREATE SCHEMA shop2`, `CREATE SCHEMA plain`,
		`CREATE UNLOGGED TABLE shop.outbox (id int)`, `CREATE UNLOGGED TABLE shop2.outbox (id int)`, `CREATE UNLOGGED TABLE plain.events (id int)`,
		`ALTER EVENT TRIGGER `+TriggerName+` ENABLE ALWAYS`); err != nil {
		t.Fatal(err)
	}
	const trigger = `the event trigger outboxd_add_tables refuses SET LOGGED alone, for the recorded outbox table pattern *.outbox of publication pub matches it`
	if err := execs(conn, `ALTER TABLE shop.outbox SET LOGGED`); err == nil || !strings.Contains(err.Error(), "which does not publish it") {
		t.Fatalf("SET LOGGED alone of a table a recorded pattern matches: %v; want the trigger's refusal", err)
	}

	// An exact name, no pattern in the configuration: the start-up check.
	err := RefuseUnlogged(ctx, conn, []string{`"shop"."outbox"`}, []string{"shop.outbox"})
	var pe *UnloggedPartitionError
	if !errors.As(err, &pe) || !pe.Self || !strings.Contains(err.Error(), trigger) ||
		!strings.Contains(err.Error(), `ALTER TABLE shop.outbox SET LOGGED; ALTER PUBLICATION "pub" ADD TABLE shop.outbox; ALTER EVENT TRIGGER outboxd_add_tables ENABLE ALWAYS; COMMIT`) {
		t.Fatalf("RefuseUnlogged of shop.outbox: %v; want the transaction with the trigger disabled", err)
	}
	if _, err := conn.Exec(ctx, remedyOf(t, err)); err != nil {
		t.Fatalf("the statements RefuseUnlogged gives: %v", err)
	}
	if err := RefuseUnlogged(ctx, conn, []string{`"shop"."outbox"`}, []string{"shop.outbox"}); err != nil {
		t.Fatalf("RefuseUnlogged after its statements: %v", err)
	}

	// An exact name beside a pattern that matches it too (the exact entry
	// wins): the match at start-up.
	_, err = MatchTables(ctx, conn, triggerConfig("shop2.outbox", "*.outbox").Tables)
	var ue *UnloggedError
	if !errors.As(err, &ue) || ue.Pattern != "" || ue.Name() != "shop2.outbox" || !strings.Contains(err.Error(), trigger) {
		t.Fatalf("MatchTables with shop2.outbox unlogged: %v; want an *UnloggedError of the exact entry with the transaction", err)
	}
	if _, err := conn.Exec(ctx, remedyOf(t, err)); err != nil {
		t.Fatalf("the statements MatchTables gives: %v", err)
	}
	if got := published(t, conn); got != "shop.outbox,shop2.outbox" {
		t.Fatalf("published: %q, want shop.outbox,shop2.outbox", got)
	}

	// No recorded pattern matches: SET LOGGED alone.
	err = RefuseUnlogged(ctx, conn, []string{`"plain"."events"`}, []string{"plain.events"})
	if err == nil || strings.Contains(err.Error(), "BEGIN") || !strings.Contains(err.Error(), "make it logged: ALTER TABLE plain.events SET LOGGED;") {
		t.Fatalf("RefuseUnlogged of plain.events: %v; want SET LOGGED alone", err)
	}
	// Nor where the recorded pattern's publication does not exist: the trigger lets SET LOGGED
	// through.
	if err := execs(conn, `ALTER EVENT TRIGGER `+TriggerName+` DISABLE`, `CREATE SCHEMA shop3`, `CREATE UNLOGGED TABLE shop3.outbox (id int)`,
		`ALTER EVENT TRIGGER `+TriggerName+` ENABLE ALWAYS`, `DROP PUBLICATION pub`); err != nil {
		t.Fatal(err)
	}
	_, err = MatchTables(ctx, conn, triggerConfig("shop3.outbox").Tables)
	if !errors.As(err, &ue) || strings.Contains(err.Error(), "BEGIN") || !strings.Contains(err.Error(), `Make it a logged table: ALTER TABLE "shop3"."outbox" SET LOGGED;`) {
		t.Fatalf("MatchTables of shop3.outbox, publication pub dropped: %v; want SET LOGGED alone", err)
	}
	if err := execs(conn, `ALTER TABLE shop3.outbox SET LOGGED`, `ALTER TABLE plain.events SET LOGGED`); err != nil {
		t.Fatalf("SET LOGGED alone: %v", err)
	}
}

// ALTER TABLE of a matching table the publication does not publish (here
// removed from it), ADD COLUMN included, is refused with a DETAIL and a
// HINT that fit it: ADD TABLE with it, or remove the pattern, not "create
// it, then INSERT" (review-patterns35 S3).
func TestTriggerRefusesAlterTableOfUnpublished(t *testing.T) {
	conn := triggerDB(t, "tenant_*.events")
	if err := execs(conn, `CREATE SCHEMA tenant_a`, `CREATE TABLE tenant_a.events (id int)`, `ALTER PUBLICATION pub DROP TABLE tenant_a.events`); err != nil {
		t.Fatal(err)
	}
	err := execs(conn, `ALTER TABLE tenant_a.events ADD COLUMN note text`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !strings.Contains(pgErr.Message, "tenant_a.events matches the outbox table pattern tenant_*.events of publication pub, which does not publish it") {
		t.Fatalf("ADD COLUMN of a matching table the publication lacks: %v; want the trigger's refusal", err)
	}
	for _, want := range []string{
		"the event trigger refuses any ALTER TABLE of a table a pattern matches while the publication does not publish it",
		"its rows written so far were never published",
	} {
		if !strings.Contains(pgErr.Detail, want) {
			t.Errorf("DETAIL %q does not say %q", pgErr.Detail, want)
		}
	}
	for _, want := range []string{"ALTER PUBLICATION pub ADD TABLE tenant_a.events;", "or ADD TABLE it by the name it has before this statement", "Or remove the pattern from postgres.tables and run outboxd migrate"} {
		if !strings.Contains(pgErr.Hint, want) {
			t.Errorf("HINT %q does not say %q", pgErr.Hint, want)
		}
	}
	if strings.Contains(pgErr.Hint, "CREATE TABLE and then INSERT") {
		t.Errorf("HINT %q speaks of creating the table", pgErr.Hint)
	}
	if err := execs(conn, `ALTER PUBLICATION pub ADD TABLE tenant_a.events`, `ALTER TABLE tenant_a.events ADD COLUMN note text`); err != nil {
		t.Fatalf("the HINT's remedy: %v", err)
	}
}

// Review-fix59 S1: the trigger's refusal of a rename, SET SCHEMA or schema
// rename into a matching name gives statements that run as printed, the
// refused statement in place of <this statement>: the names it gives exist
// only once that statement has run, so they come after it, in one
// transaction with the trigger disabled. The table is then published
// under its new name.
func TestTriggerRenameHintRuns(t *testing.T) {
	ctx := context.Background()
	conn := triggerDB(t, "tenant_*.events")
	if err := execs(conn, `CREATE SCHEMA tenant_b`, `CREATE TABLE tenant_b.staging (id int)`, `CREATE SCHEMA staging_c`, `CREATE TABLE staging_c.events (id int)`,
		`CREATE SCHEMA tenant_d`, `CREATE SCHEMA staging_d`, `CREATE TABLE staging_d.events (id int)`); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`ALTER TABLE tenant_b.staging RENAME TO events`, `ALTER SCHEMA staging_c RENAME TO tenant_c`, `ALTER TABLE staging_d.events SET SCHEMA tenant_d`} {
		err := execs(conn, q)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			t.Fatalf("%s: %v; want the trigger's refusal", q, err)
		}
		t.Logf("%s: HINT %s", q, pgErr.Hint)
		fix := strings.Replace(transactionIn(t, pgErr.Hint), "<this statement>", q, 1)
		if _, err := conn.Exec(ctx, fix); err != nil {
			t.Errorf("%s: the HINT's %q fails: %v", q, fix, err)
		}
	}
	if got := published(t, conn); got != "tenant_b.events,tenant_c.events,tenant_d.events" {
		t.Errorf("published: %q, want tenant_b.events,tenant_c.events,tenant_d.events", got)
	}
}

// The tenant restore of docs/configuration.md, in one transaction
// (review-fix59 S4): the trigger disabled inside it lets the restore's
// CREATE TABLE through unpublished until its ADD TABLE, and stays on for
// every other session, whose new tenant is published as usual. Once
// committed, the trigger is enabled always and both tables are published.
func TestTriggerRestoreInOneTransaction(t *testing.T) {
	ctx := context.Background()
	conn := triggerDB(t, "tenant_*.events")
	other := anotherConn(t, conn)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	for _, q := range []string{`ALTER EVENT TRIGGER ` + TriggerName + ` DISABLE`, `CREATE SCHEMA tenant_x`, `CREATE TABLE tenant_x.events (id int)`,
		`INSERT INTO tenant_x.events VALUES (1)`} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := execs(other, `CREATE SCHEMA tenant_y`, `CREATE TABLE tenant_y.events (id int)`); err != nil {
		t.Fatal(err)
	}
	if got := published(t, other); got != "tenant_y.events" {
		t.Fatalf("published while the restore's transaction is open: %q, want tenant_y.events (the trigger on for other sessions)", got)
	}
	for _, q := range []string{`ALTER PUBLICATION pub ADD TABLE tenant_x.events`, `ALTER EVENT TRIGGER ` + TriggerName + ` ENABLE ALWAYS`} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := published(t, conn); got != "tenant_x.events,tenant_y.events" {
		t.Errorf("published after the restore: %q, want tenant_x.events,tenant_y.events", got)
	}
	if err := CheckTrigger(ctx, conn, triggerConfig("tenant_*.events")); err != nil {
		t.Errorf("the trigger after the restore: %v", err)
	}
}
