package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
)

// 0002's index is named after the table, so that a second outbox table in a
// schema gets its own, and stays a distinct, untruncated name for long table
// names.
func TestSQLIndexName(t *testing.T) {
	long1 := strings.Repeat("x", 50) + "_one"
	long2 := strings.Repeat("x", 50) + "_two"
	for _, c := range []struct{ table, want string }{
		{"outbox", `"outbox_idempotency_key_idx"`},
		{"events", `"events_idempotency_key_idx"`},
		{long1, ""},
		{long2, ""},
	} {
		t.Run(c.table, func(t *testing.T) {
			stmts, err := migrations.SQL("app", c.table)
			if err != nil {
				t.Fatal(err)
			}
			sql := stmts[1]
			if c.want != "" && !strings.Contains(sql, "CREATE UNIQUE INDEX IF NOT EXISTS "+c.want+` ON "app".`) {
				t.Errorf("0002 for %s:\n%s\nwant index %s", c.table, sql, c.want)
			}
			if c.table != "outbox" && strings.Contains(sql, "outbox_idempotency_key_idx") {
				t.Errorf("0002 for %s still names outbox_idempotency_key_idx:\n%s", c.table, sql)
			}
		})
	}
	name := func(table string) string {
		stmts, err := migrations.SQL("app", table)
		if err != nil {
			t.Fatal(err)
		}
		_, rest, _ := strings.Cut(stmts[1], "CREATE UNIQUE INDEX IF NOT EXISTS ")
		n, _, _ := strings.Cut(rest, " ")
		return strings.Trim(n, `"`)
	}
	n1, n2 := name(long1), name(long2)
	if len(n1) > 63 || len(n2) > 63 || n1 == n2 || !strings.HasSuffix(n1, "_idempotency_key_idx") {
		t.Errorf("index names for long tables: %q (%d bytes), %q (%d bytes); want distinct, at most 63 bytes", n1, len(n1), n2, len(n2))
	}
}

func connect(t *testing.T) *pgx.Conn {
	t.Helper()
	_, dsn := testenv.NewDatabase(t, "migrations")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// uniqueKeyIndexes returns the unique indexes of schema.table on
// idempotency_key alone.
func uniqueKeyIndexes(t *testing.T, conn *pgx.Conn, schema, table string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT c.relname FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indnatts = 1 AND a.attname = 'idempotency_key'
		ORDER BY 1`, pgx.Identifier{schema, table}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// Two outbox tables in one schema each get their idempotency key index, and
// applying again changes nothing.
func TestApplyTwoTablesInOneSchema(t *testing.T) {
	conn := connect(t)
	ctx := context.Background()
	for range 2 {
		for _, table := range []string{"outbox", "events"} {
			if err := migrations.Apply(ctx, conn, "public", table); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, table := range []string{"outbox", "events"} {
		if got := uniqueKeyIndexes(t, conn, "public", table); len(got) != 1 || got[0] != table+"_idempotency_key_idx" {
			t.Errorf("unique indexes on public.%s (idempotency_key): %v; want [%s_idempotency_key_idx]", table, got, table)
		}
	}
}

// On a partitioned outbox table the migrations succeed, and 0002, whose
// unique index Postgres cannot build there, is skipped and reported.
func TestRunPartitioned(t *testing.T) {
	conn := connect(t)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `CREATE TABLE public.outbox (
		id uuid NOT NULL DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
		event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
		CREATE TABLE public.outbox_default PARTITION OF public.outbox DEFAULT`); err != nil {
		t.Fatal(err)
	}
	skipped, err := migrations.Run(ctx, conn, "public", "outbox")
	if err != nil {
		t.Fatalf("migrations on a partitioned table: %v", err)
	}
	if len(skipped) != 1 || skipped[0].Migration != "0002_idempotency_key.sql" || !strings.Contains(skipped[0].Reason, "partitioned") {
		t.Fatalf("skipped %+v; want 0002_idempotency_key.sql, for the table is partitioned", skipped)
	}
	var hasKey bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM information_schema.columns
		WHERE table_schema = 'public' AND table_name = 'outbox' AND column_name = 'idempotency_key')`).Scan(&hasKey); err != nil {
		t.Fatal(err)
	}
	if hasKey {
		t.Error("the partitioned table got an idempotency_key column without the unique index that makes it a key")
	}
	if err := migrations.Apply(ctx, conn, "public", "outbox"); err != nil {
		t.Errorf("Apply on a partitioned table: %v", err)
	}
}

// The index that earlier versions created under the fixed name
// outbox_idempotency_key_idx on another table is renamed, not built again.
func TestApplyRenamesLegacyIndex(t *testing.T) {
	conn := connect(t)
	ctx := context.Background()
	stmts, err := migrations.SQL("public", "events")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, stmts[0]+`; ALTER TABLE public.events ADD COLUMN idempotency_key text;
		CREATE UNIQUE INDEX outbox_idempotency_key_idx ON public.events (idempotency_key)`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Apply(ctx, conn, "public", "events"); err != nil {
		t.Fatal(err)
	}
	if got := uniqueKeyIndexes(t, conn, "public", "events"); len(got) != 1 || got[0] != "events_idempotency_key_idx" {
		t.Errorf("unique indexes on public.events (idempotency_key): %v; want [events_idempotency_key_idx]", got)
	}
}

// On a table that existed before, a unique index would lock its writes
// while it builds: 0002 is left out, with the statements that add it
// concurrently. Run again on a table it created, 0002 is in place.
func TestRunExistingTableSkipsTheIndex(t *testing.T) {
	conn := connect(t)
	ctx := context.Background()
	stmts, err := migrations.SQL("public", "outbox")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, stmts[0]); err != nil { // 0001 alone, as an older outboxd made it
		t.Fatal(err)
	}
	skipped, err := migrations.Run(ctx, conn, "public", "outbox")
	if err != nil {
		t.Fatal(err)
	}
	if len(skipped) != 1 || skipped[0].Migration != "0002_idempotency_key.sql" || !strings.Contains(skipped[0].Reason, "CREATE UNIQUE INDEX CONCURRENTLY") {
		t.Fatalf("skipped %+v; want 0002 with the statements that add it concurrently", skipped)
	}
	if got := uniqueKeyIndexes(t, conn, "public", "outbox"); len(got) != 0 {
		t.Errorf("an existing table got unique indexes %v", got)
	}

	fresh := connect(t)
	if skipped, err := migrations.Run(ctx, fresh, "public", "outbox"); err != nil || len(skipped) != 0 {
		t.Fatalf("Run on a new table: skipped %+v, %v; want every migration applied", skipped, err)
	}
	if skipped, err := migrations.Run(ctx, fresh, "public", "outbox"); err != nil || len(skipped) != 0 {
		t.Fatalf("Run again on a table it made: skipped %+v, %v; want nothing skipped", skipped, err)
	}
}

// The table gets the column names the router reads.
func TestRunWithColumnNames(t *testing.T) {
	conn := connect(t)
	ctx := context.Background()
	_, err := migrations.RunWith(ctx, conn, "public", "outboxevent", migrations.Options{Columns: map[string]string{
		"aggregate_type": "aggregatetype", "aggregate_id": "aggregateid", "event_type": "", "payload": "Payload"}})
	if err != nil {
		t.Fatal(err)
	}
	var cols []string
	if err := conn.QueryRow(ctx, `SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute
		WHERE attrelid = 'public.outboxevent'::regclass AND attnum > 0 AND NOT attisdropped`).Scan(&cols); err != nil {
		t.Fatal(err)
	}
	if want := "id aggregatetype aggregateid Payload created_at idempotency_key"; strings.Join(cols, " ") != want {
		t.Errorf("columns %v; want %s", cols, want)
	}
}
