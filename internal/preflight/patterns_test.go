package preflight

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/wal"
)

// TestPublicationRefusesATableCreatedBeforeIt: at the first start, a
// table a pattern matches that is created after the start-up checks listed
// the tables and before outboxd creates the publication is skipped by the
// event trigger (no publication yet) and is not in the list the
// publication is created for. The start is refused naming it, instead of
// streaming without it (review-patterns35 S4). It needs the test bed's
// Postgres (OUTBOXD_TEST_PG_DSN).
func TestPublicationRefusesATableCreatedBeforeIt(t *testing.T) {
	_, conn := newConn(t, "pubrace")
	ctx := context.Background()
	pc := config.Postgres{Publication: "outboxd", CreatePublication: true, Tables: []config.TableEntry{{Name: "tenant_*.events"}}}
	if _, err := pg.InstallTrigger(ctx, conn, pc); err != nil {
		t.Fatal(err)
	}
	const table = ` (event_id uuid PRIMARY KEY, body jsonb NOT NULL)`
	if _, err := conn.Exec(ctx, `CREATE SCHEMA tenant_a; CREATE TABLE tenant_a.events`+table); err != nil {
		t.Fatal(err)
	}
	// What resolvePatterns lists.
	match := func() []wal.Table {
		t.Helper()
		ms, err := pg.MatchTables(ctx, conn, pc.Tables)
		if err != nil {
			t.Fatal(err)
		}
		var tables []wal.Table
		for _, m := range ms {
			tables = append(tables, wal.Table{Schema: m.Schema, Name: m.Table})
		}
		return tables
	}
	tables := match()
	// Between the two steps: a tenant created while no publication exists.
	if _, err := conn.Exec(ctx, `CREATE SCHEMA tenant_b; CREATE TABLE tenant_b.events`+table); err != nil {
		t.Fatal(err)
	}
	_, err := ensurePublication(ctx, conn, pc, tables)
	want := `tenant_b.events, which postgres.tables matches, was created after outboxd listed the tables it matches and before it created publication "outboxd"`
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `ALTER PUBLICATION "outboxd" ADD TABLE "tenant_b"."events"`) {
		t.Fatalf("creating the publication with tenant_b.events left out: %v; want %q and the ADD TABLE", err, want)
	}
	// The remedy, and the next start finds both published.
	if _, err := conn.Exec(ctx, `ALTER PUBLICATION outboxd ADD TABLE tenant_b.events`); err != nil {
		t.Fatal(err)
	}
	tables = match()
	if _, err := ensurePublication(ctx, conn, pc, tables); err != nil || len(tables) != 2 {
		t.Fatalf("after the ADD TABLE: %v, tables %v", err, tables)
	}
}

// A start with postgres.tables without a pattern warns of patterns still
// recorded for its publication by an earlier outboxd migrate with
// patterns: the trigger goes on adding the tables they match, and outboxd
// would stop at their first row (review-patterns35 S2). With none
// recorded, it says nothing.
func TestStartWarnsOfRecordedPatterns(t *testing.T) {
	_, conn := newConn(t, "recorded")
	ctx := context.Background()
	cfg := config.Default()
	cfg.Postgres.Table = "public.outbox"
	resolve := func() string {
		t.Helper()
		var buf bytes.Buffer
		c := New(cfg, shard.Shard{Count: 1}, slog.New(slog.NewTextHandler(&buf, nil)), nil, nil)
		if _, err := c.resolvePatterns(ctx, conn); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	if log := resolve(); log != "" {
		t.Errorf("without the trigger: logged %q, want nothing", log)
	}
	pc := config.Postgres{Publication: cfg.Postgres.Publication, Tables: []config.TableEntry{{Name: "tenant_*.events"}}}
	if _, err := pg.InstallTrigger(ctx, conn, pc); err != nil {
		t.Fatal(err)
	}
	log := resolve()
	if !strings.Contains(log, `level=WARN msg="patterns are recorded for the event trigger for this publication, but postgres.tables has none`) ||
		!strings.Contains(log, `patterns=tenant_*.events`) || !strings.Contains(log, "run outboxd migrate with this configuration") {
		t.Errorf("with tenant_*.events recorded: logged %q, want the warning", log)
	}
}

// newConn connects to a new database of the test bed's Postgres
// (OUTBOXD_TEST_PG_DSN), dropped after the test.
func newConn(t *testing.T, prefix string) (dsn string, conn *pgx.Conn) {
	t.Helper()
	_, dsn = testenv.NewDatabase(t, prefix)
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return dsn, conn
}
