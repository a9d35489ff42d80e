package pg

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
)

// Match is one table that an entry of postgres.tables names.
type Match struct {
	Schema, Table string
	Entry         int // the index of the entry in postgres.tables
}

// Name is schema.table, unquoted, as postgres.tables writes names.
func (m Match) Name() string { return m.Schema + "." + m.Table }

// outboxKinds is the condition, on pg_class c and pg_namespace n, that a
// table an entry of postgres.tables names meets: an ordinary or
// partitioned table, not a partition (a partitioned outbox publishes its
// partitions' rows under its own name), outside the system schemas and
// the event trigger's.
const outboxKinds = `c.relkind IN ('r', 'p') AND NOT c.relispartition
	AND n.nspname NOT IN ('pg_catalog', 'information_schema', '` + TriggerSchema + `') AND n.nspname NOT LIKE 'pg\_toast%' AND n.nspname NOT LIKE 'pg\_temp\_%'`

// persistent is the condition that a table a pattern matches meets too:
// it is permanent, for Postgres publishes no temporary or unlogged table
// (ADD TABLE refuses them). A pattern leaves them out, at start-up and in
// the event trigger alike, so that a scratch table of a matching name
// (CREATE TEMP TABLE outbox …) is no outbox table and its CREATE succeeds.
const persistent = `c.relpersistence = 'p'`

// MatchTables returns the tables each entry names, in the order of the
// entries and, within a pattern, of their names: ordinary and partitioned
// tables, not partitions (a partitioned outbox publishes its partitions'
// rows under its own name), outside the system schemas (outboxKinds); a
// pattern matches permanent tables only (persistent). An exact name that
// names no table is an error; a pattern may match none. A table that two
// entries match is the entry's that config.Postgres.EntryOf gives: the one
// that names it exactly, else the first pattern, as when it is created
// while outboxd runs.
func MatchTables(ctx context.Context, conn *pgx.Conn, entries []config.TableEntry) ([]Match, error) {
	var out []Match
	all := config.Postgres{Tables: entries}
	for i, e := range entries {
		schema, table := e.Split()
		cond := outboxKinds
		if e.Pattern() {
			cond += " AND " + persistent
		}
		rows, err := conn.Query(ctx, `SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname LIKE $1 AND c.relname LIKE $2 AND `+cond+`
			ORDER BY 1, 2`, config.LikePattern(schema), config.LikePattern(table))
		if err != nil {
			return nil, fmt.Errorf("listing the tables postgres.tables[%d] (%s) names: %w", i, e.Name, err)
		}
		var ms []Match
		var s, t string
		_, err = pgx.ForEachRow(rows, []any{&s, &t}, func() error {
			// LIKE compares by the database's collation; Matches exactly.
			if j, ok := all.EntryOf(s, t); e.Matches(s, t) && ok && j == i {
				ms = append(ms, Match{Schema: s, Table: t, Entry: i})
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("listing the tables postgres.tables[%d] (%s) names: %w", i, e.Name, err)
		}
		if len(ms) == 0 && !e.Pattern() {
			return nil, fmt.Errorf("outbox table %s (postgres.tables[%d]) does not exist; run 'outboxd migrate' to create it, or correct the name (it is compared exactly: no quotes, case as in the catalogue)", e.Name, i)
		}
		out = append(out, ms...)
	}
	return out, nil
}

// MatchNames returns the names of ms, comma-separated, for a log line.
func MatchNames(ms []Match) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name()
	}
	return strings.Join(names, ",")
}
