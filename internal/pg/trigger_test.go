package pg

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/testenv"
)

// triggerDB returns a connection to a new database of the test bed with
// publication pub and the event trigger installed for the patterns
// (postgres.tables) names.
func triggerDB(t *testing.T, names ...string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	_, dsn := testenv.NewDatabase(t, "trigger")
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, `CREATE PUBLICATION pub`); err != nil {
		t.Fatal(err)
	}
	if err := InstallTrigger(ctx, conn, triggerConfig(names...)); err != nil {
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
	err := conn.QueryRow(context.Background(), `SELECT coalesce(array_agg(schemaname || '.' || tablename ORDER BY 1), '{}')
		FROM pg_publication_tables WHERE pubname = 'pub'`).Scan(&names)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(names, ",")
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

// A temporary or an unlogged table of a matching name is no outbox table:
// its CREATE succeeds and it is not published (review-patterns35 M3).
func TestTriggerSkipsTemporaryAndUnlogged(t *testing.T) {
	conn := triggerDB(t, "*.outbox")
	if err := execs(conn, `CREATE TEMP TABLE outbox (id int)`, `CREATE SCHEMA scratch`, `CREATE UNLOGGED TABLE scratch.outbox (id int)`,
		`ALTER TABLE scratch.outbox ADD COLUMN at date`, `CREATE TABLE scratch.outbox2 (id int)`); err != nil {
		t.Fatalf("a temporary or unlogged table of a matching name: %v", err)
	}
	if got := published(t, conn); got != "" {
		t.Fatalf("published: %q, want none", got)
	}
	if err := execs(conn, `CREATE SCHEMA shop`, `CREATE TABLE shop.outbox (id int)`); err != nil {
		t.Fatal(err)
	}
	if got := published(t, conn); got != "shop.outbox" {
		t.Fatalf("published: %q, want shop.outbox", got)
	}
}
