package pg

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/config"
)

// TestMatchTables resolves names and patterns against a real catalogue.
func TestMatchTables(t *testing.T) {
	ctx := context.Background()
	_, conn := newDatabase(t, "match")
	_, err := conn.Exec(ctx, `
		CREATE SCHEMA orders; CREATE SCHEMA wallet; CREATE SCHEMA tenant_a; CREATE SCHEMA tenant_b; CREATE SCHEMA "tenantXa"; CREATE SCHEMA "Tenant_c";
		CREATE TABLE orders.outbox (id int); CREATE TABLE wallet.outbox (id int); CREATE TABLE wallet.outbox_old (id int);
		CREATE TABLE tenant_a.outbox_events (id int, at date) PARTITION BY RANGE (at);
		CREATE TABLE tenant_a.outbox_events_2026 PARTITION OF tenant_a.outbox_events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
		CREATE TABLE tenant_b.outbox_events (id int); CREATE TABLE "tenantXa".outbox_events (id int); CREATE TABLE "Tenant_c".outbox_events (id int);
		CREATE VIEW tenant_b.outbox_view AS SELECT 1;
		CREATE SCHEMA scratch; CREATE TABLE scratch.outbox_u (id int); CREATE TEMP TABLE outbox (id int);
		CREATE SCHEMA tenant_u; CREATE UNLOGGED TABLE tenant_u.events (id int);`)
	if err != nil {
		t.Fatal(err)
	}
	entries := func(names ...string) []config.TableEntry {
		var out []config.TableEntry
		for _, n := range names {
			out = append(out, config.TableEntry{Name: n})
		}
		return out
	}
	for _, tc := range []struct {
		names []string
		want  string // MatchNames, or the error's text
	}{
		{[]string{"orders.outbox"}, "orders.outbox"},
		{[]string{"*.outbox"}, "orders.outbox,wallet.outbox"},                                 // not the temporary one (review-patterns35 M3)
		{[]string{"tenant_*.outbox_events"}, "tenant_a.outbox_events,tenant_b.outbox_events"}, // not tenantXa (_ is no wildcard), nor Tenant_c, nor the partition
		{[]string{"tenant_*.outbox*"}, "tenant_a.outbox_events,tenant_b.outbox_events"},       // tables only, no view
		{[]string{"orders.outbox", "tenant_*.outbox_events", "nobody_*.outbox"}, "orders.outbox,tenant_a.outbox_events,tenant_b.outbox_events"},
		{[]string{"shop.outbox"}, "outbox table shop.outbox (postgres.tables[0]) does not exist"},
		// An unlogged table is refused, not left out: its rows are not in
		// the WAL (review-eosbf MF1).
		{[]string{"orders.outbox", "tenant_*.events"}, `outbox table tenant_u.events (postgres.tables[1], pattern tenant_*.events) is UNLOGGED`},
		{[]string{"tenant_*.events"}, `ALTER TABLE "tenant_u"."events" SET LOGGED`},
		{[]string{"tenant_u.events"}, `outbox table tenant_u.events (postgres.tables[0]) is UNLOGGED`},
		{[]string{"Orders.outbox"}, "outbox table Orders.outbox (postgres.tables[0]) does not exist"},
		// A table two entries match is the exact entry's, else the first
		// pattern's, once (review-patterns35 M2).
		{[]string{"orders.outbox", "*.outbox"}, "orders.outbox,wallet.outbox"},
		{[]string{"*.outbox", "orders.outbox"}, "wallet.outbox,orders.outbox"},
		{[]string{"tenant_*.outbox_events", "*.outbox_events"}, "tenant_a.outbox_events,tenant_b.outbox_events,Tenant_c.outbox_events,tenantXa.outbox_events"},
	} {
		ms, err := MatchTables(ctx, conn, entries(tc.names...))
		got := MatchNames(ms)
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("MatchTables(%v) = %s, want %s", tc.names, got, tc.want)
		}
	}
}

// Review-fix59 S2: an UNLOGGED partitioned table a pattern matches
// (Postgres 14 to 17 allow one; made while the trigger was disabled, or
// before the pattern was recorded) is refused by MatchTables with the
// remedy RefuseUnlogged gives such a table: re-create it. SET LOGGED
// changes nothing of a partitioned table, so the transaction with it would
// fail ("cannot add relation") and the refusal would come back. The table
// re-created without UNLOGGED is taken.
func TestMatchTablesPartitionedUnlogged(t *testing.T) {
	ctx := context.Background()
	conn := triggerDB(t, "*.outbox")
	if err := execs(conn, `ALTER EVENT TRIGGER `+TriggerName+` DISABLE`, `CREATE SCHEMA shop`,
		`CREATE UNLOGGED TABLE shop.outbox (id int, at date) PARTITION BY RANGE (at)`,
		`ALTER EVENT TRIGGER `+TriggerName+` ENABLE ALWAYS`); err != nil {
		// Postgres 18 refuses an UNLOGGED partitioned table, so there is
		// none to match: that refusal is the behaviour there.
		var v int
		if qerr := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&v); qerr != nil || v < 180000 ||
			!strings.Contains(err.Error(), "unlogged") {
			t.Fatal(err)
		}
		return
	}
	_, err := MatchTables(ctx, conn, triggerConfig("*.outbox").Tables)
	var ue *UnloggedError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), `re-create "shop"."outbox" without UNLOGGED (SET LOGGED does not change a partitioned table)`) ||
		strings.Contains(err.Error(), "SET LOGGED;") || strings.Contains(err.Error(), "BEGIN") {
		t.Fatalf("MatchTables: %v; want an *UnloggedError that says to re-create the partitioned table", err)
	}
	if err := execs(conn, `DROP TABLE shop.outbox`, `CREATE TABLE shop.outbox (id int, at date) PARTITION BY RANGE (at)`); err != nil {
		t.Fatal(err)
	}
	if _, err := MatchTables(ctx, conn, triggerConfig("*.outbox").Tables); err != nil {
		t.Errorf("MatchTables after the table was re-created: %v", err)
	}
}
