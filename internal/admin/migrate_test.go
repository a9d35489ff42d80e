package admin

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/internal/testenv"
)

// migrateConfig is a configuration of the database at dsn with
// postgres.tables names.
func migrateConfig(dsn string, names ...string) config.Config {
	cfg := config.Default()
	cfg.Postgres.DSN, cfg.Postgres.Table, cfg.Postgres.Tables = dsn, "", nil
	for _, n := range names {
		cfg.Postgres.Tables = append(cfg.Postgres.Tables, config.TableEntry{Name: n})
	}
	if len(names) == 1 && !cfg.Postgres.Patterns() {
		cfg.Postgres.Table, cfg.Postgres.Tables = names[0], nil
	}
	return cfg
}

// migrateLogged runs Migrate with cfg and returns what it logged.
func migrateLogged(t *testing.T, cfg config.Config) string {
	t.Helper()
	var buf bytes.Buffer
	if err := Migrate(context.Background(), cfg, slog.New(slog.NewTextHandler(&buf, nil))); err != nil {
		t.Fatalf("Migrate: %v\n%s", err, buf.String())
	}
	return buf.String()
}

// migrateDB returns a new database of the test bed, and a connection to
// it, where outboxd migrate made public.outbox and stmts then ran.
func migrateDB(t *testing.T, prefix string, stmts ...string) (dsn string, conn *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	_, dsn = testenv.NewDatabase(t, prefix)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	migrateLogged(t, migrateConfig(dsn, "public.outbox"))
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return dsn, conn
}

// publishedBy returns the tables publication outboxd publishes, sorted
// and comma-separated.
func publishedBy(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var names []string
	if err := conn.QueryRow(context.Background(), `SELECT array_agg(schemaname || '.' || tablename ORDER BY 1) FROM pg_publication_tables WHERE pubname = 'outboxd'`).Scan(&names); err != nil {
		t.Fatal(err)
	}
	return strings.Join(names, ",")
}

// Review-patterns35 S2 and S3: outboxd migrate with a pattern, run where
// the publication exists, adds to it the tables the pattern already
// matches, and says that their rows written before are not delivered (an
// UNLOGGED one it leaves out, and names with the statements that make it
// logged); ALTER TABLE of such a table
// then goes through the trigger. Run again with a configuration without a
// pattern, it deletes the patterns recorded for its publication, so that
// the trigger no longer adds new tables to it, and names the tables they
// added, which stay in the publication. It needs the test bed's
// Postgres (OUTBOXD_TEST_PG_DSN) and its superuser.
func TestMigratePatternsAddedAndRemoved(t *testing.T) {
	ctx := context.Background()
	const events = ` (id uuid PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL)`
	dsn, conn := migrateDB(t, "migpat", `CREATE PUBLICATION outboxd FOR TABLE public.outbox`,
		`CREATE SCHEMA tenant_a`, `CREATE TABLE tenant_a.events`+events, `CREATE PUBLICATION other FOR TABLE tenant_a.events`,
		`CREATE SCHEMA tenant_u`, `CREATE UNLOGGED TABLE tenant_u.events`+events)
	published := func() string { t.Helper(); return publishedBy(t, conn) }

	patterned := migrateConfig(dsn, "public.outbox", "tenant_*.events")
	log := migrateLogged(t, patterned)
	if got := published(); got != "public.outbox,tenant_a.events" {
		t.Errorf("published after migrate with the pattern: %s, want public.outbox,tenant_a.events", got)
	}
	if !strings.Contains(log, `level=WARN msg="added to the publication the tables that a pattern of postgres.tables matches and that it did not publish: their rows written before now are not delivered; send those still pending with outboxd replay`) ||
		!strings.Contains(log, `tables=tenant_a.events`) {
		t.Errorf("migrate with the pattern logged:\n%s\nwant the warning naming tenant_a.events", log)
	}
	// Another publication lists it by name: delivered twice (review-fix59 S7).
	if !strings.Contains(log, `level=WARN msg="added to the publication tables that other publications list by name`) || !strings.Contains(log, `tables="tenant_a.events (publication other)"`) {
		t.Errorf("migrate with the pattern logged:\n%s\nwant the warning that publication other lists tenant_a.events", log)
	}
	// The UNLOGGED one, with the statements that make it logged and
	// publish it (review-fix59 S3).
	if !strings.Contains(log, `level=WARN msg="did not add to the publication a table that a pattern of postgres.tables matches, for it is UNLOGGED`) ||
		!strings.Contains(log, `table=tenant_u.events`) || !strings.Contains(log, `ALTER TABLE \"tenant_u\".\"events\" SET LOGGED; ALTER PUBLICATION \"outboxd\" ADD TABLE \"tenant_u\".\"events\"`) {
		t.Errorf("migrate with the pattern logged:\n%s\nwant the warning naming tenant_u.events with SET LOGGED", log)
	}
	if _, err := conn.Exec(ctx, `ALTER TABLE tenant_a.events ADD COLUMN note text`); err != nil {
		t.Errorf("ALTER TABLE of the table migrate published: %v", err)
	}
	if log := migrateLogged(t, patterned); strings.Contains(log, "added to the publication") {
		t.Errorf("a second migrate with the pattern logged:\n%s\nwant nothing added", log)
	}

	log = migrateLogged(t, migrateConfig(dsn, "public.outbox"))
	if p, err := pg.RecordedPatterns(ctx, conn, "outboxd"); err != nil || len(p) != 0 {
		t.Fatalf("patterns recorded for outboxd after migrate without a pattern: %v, %v; want none", p, err)
	}
	if !strings.Contains(log, `msg="deleted the patterns recorded for the publication, which postgres.tables no longer has`) || !strings.Contains(log, `patterns=tenant_*.events`) {
		t.Errorf("migrate without a pattern logged:\n%s\nwant the patterns it deleted", log)
	}
	// The table they added stays in the publication: said, with the DROP
	// TABLE that removes it (review-fix59 S5).
	if !strings.Contains(log, `the tables they added stay in the publication`) || !strings.Contains(log, `tables=tenant_a.events`) ||
		!strings.Contains(log, `run="ALTER PUBLICATION \"outboxd\" DROP TABLE \"tenant_a\".\"events\""`) {
		t.Errorf("migrate without a pattern logged:\n%s\nwant tenant_a.events named, with the DROP TABLE", log)
	}
	if _, err := conn.Exec(ctx, `CREATE SCHEMA tenant_b; CREATE TABLE tenant_b.events`+events); err != nil {
		t.Fatal(err)
	}
	if got := published(); got != "public.outbox,tenant_a.events" {
		t.Errorf("published after a new tenant: %s; want tenant_b.events left out, the patterns deleted", got)
	}
}

// Review-fix59 M1: outboxd migrate refuses, before it changes anything, to
// add tables to the publication or change the recorded patterns while an
// outboxd streams the configuration's slot, here shard 0 of 2 of
// postgres.slot: a running outboxd of the configuration from before would
// pass over the rows of the tables it adds. Once the slot is free it goes
// through; run again with the same patterns while the slot is streamed
// (an upgrade), it goes through too.
func TestMigrateRefusedWhileStreaming(t *testing.T) {
	ctx := context.Background()
	const slot = "outboxd_0of2"
	dsn, conn := migrateDB(t, "migstream", `CREATE PUBLICATION outboxd FOR TABLE public.outbox`,
		`CREATE SCHEMA tenant_a`, `CREATE TABLE tenant_a.events (id uuid PRIMARY KEY)`,
		`SELECT pg_create_logical_replication_slot('`+slot+`', 'pgoutput')`)
	stream := func() *pgconn.PgConn {
		t.Helper()
		rc, err := pgconn.Connect(ctx, dsn+"&replication=database")
		if err != nil {
			t.Fatal(err)
		}
		if err := pglogrepl.StartReplication(ctx, rc, slot, 0, pglogrepl.StartReplicationOptions{
			PluginArgs: []string{"proto_version '1'", "publication_names 'outboxd'"}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rc.Close(context.Background()) })
		return rc
	}
	// waitActive waits until the slot is streamed, or not.
	waitActive := func(want bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			var active bool
			if err := conn.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active); err != nil {
				t.Fatal(err)
			}
			if active == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("slot %s active = %v after 10s, want %v", slot, active, want)
			}
		}
	}
	published := func() string { t.Helper(); return publishedBy(t, conn) }

	rc := stream()
	waitActive(true)
	patterned := migrateConfig(dsn, "public.outbox", "tenant_*.events")
	err := Migrate(ctx, patterned, testenv.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "outboxd streams slot "+slot+" (pid ") ||
		!strings.Contains(err.Error(), "stop it, run outboxd migrate, then start outboxd with this configuration") ||
		!strings.Contains(err.Error(), `add tenant_a.events, which the patterns of postgres.tables match, to publication "outboxd"`) {
		t.Fatalf("Migrate with a new pattern while %s is streamed: %v; want the refusal naming the slot and tenant_a.events", slot, err)
	}
	t.Logf("refusal: %v", err)
	if got := published(); got != "public.outbox" {
		t.Errorf("published after the refusal: %s, want public.outbox", got)
	}
	if p, err := pg.RecordedPatterns(ctx, conn, "outboxd"); err != nil || len(p) != 0 {
		t.Errorf("patterns recorded after the refusal: %v, %v; want none", p, err)
	}

	rc.Close(ctx)
	waitActive(false)
	migrateLogged(t, patterned)
	if got := published(); got != "public.outbox,tenant_a.events" {
		t.Errorf("published after migrate with the slot free: %s, want public.outbox,tenant_a.events", got)
	}
	stream()
	waitActive(true)
	migrateLogged(t, patterned)
}
