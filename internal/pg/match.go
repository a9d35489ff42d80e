package pg

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
// the event trigger's, and not temporary (a temporary table lives in a
// pg_temp_N schema): a scratch table of a matching name (CREATE TEMP TABLE
// outbox …) is no outbox table. An UNLOGGED table is taken, and refused
// (MatchTables, the event trigger): its rows are not in the WAL, and
// leaving it out would lose them without a word (review-eosbf MF1).
const outboxKinds = `c.relkind IN ('r', 'p') AND NOT c.relispartition
	AND n.nspname NOT IN ('pg_catalog', 'information_schema', '` + TriggerSchema + `') AND n.nspname NOT LIKE 'pg\_toast%' AND n.nspname NOT LIKE 'pg\_temp\_%'`

// MatchTables returns the tables each entry names, in the order of the
// entries and, within a pattern, of their names: ordinary and partitioned
// tables, not partitions (a partitioned outbox publishes its partitions'
// rows under its own name), not temporary, outside the system schemas
// (outboxKinds). An exact name that names no table is an error; a pattern
// may match none. An UNLOGGED table an entry names is an error that says
// how to make it logged: Postgres writes no WAL for its rows. A table that two
// entries match is the entry's that config.Postgres.EntryOf gives: the one
// that names it exactly, else the first pattern, as when it is created
// while outboxd runs.
func MatchTables(ctx context.Context, conn *pgx.Conn, entries []config.TableEntry) ([]Match, error) {
	var out []Match
	all := config.Postgres{Tables: entries}
	for i, e := range entries {
		schema, table := e.Split()
		rows, err := conn.Query(ctx, `SELECT n.nspname::text, c.relname::text, c.relpersistence = 'u', c.relkind = 'p' FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname LIKE $1 AND c.relname LIKE $2 AND `+outboxKinds+`
			ORDER BY 1, 2`, config.LikePattern(schema), config.LikePattern(table))
		if err != nil {
			return nil, fmt.Errorf("listing the tables postgres.tables[%d] (%s) names: %w", i, e.Name, err)
		}
		var ms []Match
		var s, t string
		var unlogged, partitioned bool
		var ue *UnloggedError
		_, err = pgx.ForEachRow(rows, []any{&s, &t, &unlogged, &partitioned}, func() error {
			// LIKE compares by the database's collation; Matches exactly.
			if j, ok := all.EntryOf(s, t); !e.Matches(s, t) || !ok || j != i || ue != nil {
				return nil
			}
			if unlogged {
				ue = &UnloggedError{Match: Match{Schema: s, Table: t, Entry: i}, Partitioned: partitioned}
				if e.Pattern() {
					ue.Pattern = e.Name
				}
				return nil
			}
			ms = append(ms, Match{Schema: s, Table: t, Entry: i})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("listing the tables postgres.tables[%d] (%s) names: %w", i, e.Name, err)
		}
		if ue != nil && !ue.Partitioned {
			if ue.Recorded, err = RecordedFor(ctx, conn, ue.Schema, ue.Table); err != nil {
				return nil, fmt.Errorf("outbox table %s (postgres.tables[%d]) is UNLOGGED, and reading the patterns recorded for the event trigger failed: %w", ue.Name(), i, err)
			}
		}
		if ue != nil {
			return nil, ue
		}
		if len(ms) == 0 && !e.Pattern() {
			return nil, fmt.Errorf("outbox table %s (postgres.tables[%d]) does not exist; run 'outboxd migrate' to create it, or correct the name (it is compared exactly: no quotes, case as in the catalogue)", e.Name, i)
		}
		out = append(out, ms...)
	}
	return out, nil
}

// UnloggedError is an UNLOGGED table that an entry of postgres.tables
// names: Postgres writes no WAL for its rows, so no publication can
// publish it and they would never be delivered.
type UnloggedError struct {
	Match
	Pattern     string     // the entry's pattern, "" for an exact name
	Partitioned bool       // a partitioned table, which SET LOGGED does not change
	Recorded    []Recorded // the recorded patterns that match it, unless Partitioned
}

func (e *UnloggedError) Error() string {
	name := pgx.Identifier{e.Schema, e.Table}.Sanitize()
	entry, other := fmt.Sprintf("postgres.tables[%d]", e.Entry), ""
	if e.Pattern != "" {
		entry += ", pattern " + e.Pattern
		other = ". Or drop it, or rename it to a name the pattern does not match"
	}
	fix := "Make it a logged table: " + loggedRemedy(name, e.Recorded)
	if e.Partitioned {
		fix = recreateRemedy(name)
	}
	return fmt.Sprintf("outbox table %s (%s) is UNLOGGED: Postgres writes no WAL for its rows, so no publication can publish it and they would never be delivered. "+
		"%s; the rows it holds now were never in the WAL: send them with outboxd replay%s",
		e.Name(), entry, fix, other)
}

// Recorded is a pattern that outboxd migrate recorded for the event
// trigger (PatternTable) and that matches a table, of a publication that
// exists: while the trigger is enabled it refuses any change of the table
// that leaves it logged and not published by Publication, whichever
// outboxd's publication that is (a SET LOGGED, since an UNLOGGED table
// cannot be published first).
type Recorded struct {
	Publication, Pattern string
}

// RecordedFor returns the patterns recorded in PatternTable that match
// schema.table, as the event trigger matches them, and whose publication
// exists, when the trigger is installed and not disabled; else none, for
// nothing refuses a change.
func RecordedFor(ctx context.Context, q querier, schema, table string) ([]Recorded, error) {
	var armed bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = $2 AND evtenabled <> 'D')`,
		PatternTable, TriggerName).Scan(&armed); err != nil || !armed {
		return nil, err
	}
	rows, err := q.Query(ctx, `SELECT p.publication, p.pattern FROM `+PatternTable+` p
		WHERE $1::text LIKE p.schema_like AND $2::text LIKE p.table_like AND EXISTS (SELECT 1 FROM pg_publication b WHERE b.pubname = p.publication)
		ORDER BY 1, 2`, schema, table)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Recorded])
}

// loggedRemedy is what makes the UNLOGGED table name (quoted) a logged
// one: ALTER TABLE … SET LOGGED alone, unless recorded patterns match it
// (rec). Then the event trigger refuses that statement, for it leaves a
// matching table their publications do not publish, and an UNLOGGED table
// cannot be published first; so it runs in one transaction with the
// trigger disabled for that transaction only, followed by ADD TABLE to
// each of those publications (review-fix55 N1).
func loggedRemedy(name string, rec []Recorded) string {
	if len(rec) == 0 {
		return "ALTER TABLE " + name + " SET LOGGED"
	}
	var which []string
	stmts := []string{"BEGIN", "ALTER EVENT TRIGGER " + TriggerName + " DISABLE", "ALTER TABLE " + name + " SET LOGGED"}
	for _, r := range rec {
		which = append(which, fmt.Sprintf("%s of publication %s", r.Pattern, r.Publication))
		if add := addTable(r.Publication, name); !slices.Contains(stmts, add) {
			stmts = append(stmts, add)
		}
	}
	stmts = append(stmts, "ALTER EVENT TRIGGER "+TriggerName+" ENABLE ALWAYS", "COMMIT")
	return fmt.Sprintf("the event trigger %s refuses SET LOGGED alone, for the recorded outbox table pattern %s matches it; "+
		"as a superuser, in one transaction with the trigger disabled for that transaction only, make it logged and publish it: %s",
		TriggerName, strings.Join(which, " and "), strings.Join(stmts, "; "))
}

// recreateRemedy is what makes the UNLOGGED partitioned table name
// (quoted) a logged one: SET LOGGED changes nothing of a table without
// storage of its own (Postgres 14 to 17; review-fix59 S2).
func recreateRemedy(name string) string {
	return fmt.Sprintf("re-create %s without UNLOGGED (SET LOGGED does not change a partitioned table) and move its partitions to it", name)
}

func addTable(publication, name string) string {
	return "ALTER PUBLICATION " + pgx.Identifier{publication}.Sanitize() + " ADD TABLE " + name
}

// MatchNames returns the names of ms, comma-separated, for a log line.
func MatchNames(ms []Match) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name()
	}
	return strings.Join(names, ",")
}

// unloggedTreeQuery finds, for the outbox tables by their quoted names
// ($1), the first table or partition, at any depth, that is UNLOGGED: the
// entry's place (from 1), its name quoted, its schema and name, whether
// it is partitioned, and whether it is the outbox table itself. The table
// itself is added to its tree: pg_partition_tree lists nothing for a
// table that is neither partitioned nor a partition (review-fix55 N1).
const unloggedTreeQuery = `SELECT u.i::int, format('%I.%I', n.nspname, q.relname), n.nspname::text, q.relname::text, q.relkind = 'p', t.level = 0
	FROM unnest($1::text[]) WITH ORDINALITY AS u(name, i)
	CROSS JOIN LATERAL (SELECT relid, level FROM pg_partition_tree(to_regclass(u.name)) UNION SELECT to_regclass(u.name), 0) t
	JOIN pg_class q ON q.oid = t.relid JOIN pg_namespace n ON n.oid = q.relnamespace
	WHERE q.relpersistence = 'u' ORDER BY u.i, t.level, 2 LIMIT 1`

// RefuseUnlogged refuses an outbox table, by its quoted name (quoted), or
// any of its partitions at any depth, that is UNLOGGED
// (*UnloggedPartitionError); shown are the names for messages. Postgres
// writes no WAL for the rows of an unlogged partition, and its root's
// publication, with publish_via_partition_root, publishes nothing of them:
// they would be lost without a word. Postgres lets an unlogged table
// become a partition of a published one (CREATE UNLOGGED TABLE … PARTITION
// OF, ATTACH PARTITION, SET UNLOGGED of a partition), and the event
// trigger covers only the tables a pattern matches. It is one catalogue
// query, run at start-up for every outbox table and by the periodic check
// (tables.Watch).
func RefuseUnlogged(ctx context.Context, q querier, quoted, shown []string) error {
	var (
		i                     int
		name, schema, relname string
		partitioned, table    bool
	)
	err := q.QueryRow(ctx, unloggedTreeQuery, quoted).Scan(&i, &name, &schema, &relname, &partitioned, &table)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading whether the outbox tables or their partitions are UNLOGGED: %w", err)
	}
	if i < 1 || i > len(shown) {
		return fmt.Errorf("reading whether the outbox tables or their partitions are UNLOGGED: table %d of %d", i, len(shown))
	}
	ue := &UnloggedPartitionError{Table: shown[i-1], Partition: name, Partitioned: partitioned, Self: table}
	if table && !partitioned {
		if ue.Recorded, err = RecordedFor(ctx, q, schema, relname); err != nil {
			return fmt.Errorf("outbox table %s is UNLOGGED, and reading the patterns recorded for the event trigger failed: %w", ue.Table, err)
		}
	}
	return ue
}

// UnloggedPartitionError is an outbox table, or one of its partitions,
// that is UNLOGGED: its rows are in no WAL, so the slot never sees them.
type UnloggedPartitionError struct {
	Table       string // the outbox table, schema.table
	Partition   string // the unlogged table, quoted: Table itself or one of its partitions
	Partitioned bool   // the unlogged table is partitioned (no storage of its own)
	Self        bool   // the unlogged table is the outbox table itself
	// Recorded are the recorded patterns that match the outbox table,
	// when it is the unlogged one (Self) and not partitioned.
	Recorded []Recorded
}

func (e *UnloggedPartitionError) Error() string {
	what := fmt.Sprintf("outbox table %s has the UNLOGGED partition %s", e.Table, e.Partition)
	if e.Self {
		what = fmt.Sprintf("outbox table %s is UNLOGGED", e.Table)
	}
	fix := "make it logged: " + loggedRemedy(e.Partition, e.Recorded)
	if e.Partitioned {
		// SET LOGGED of a partitioned table changes nothing: it has no
		// storage of its own (Postgres 14 to 17).
		fix = recreateRemedy(e.Partition)
	}
	return fmt.Sprintf("%s: Postgres writes no WAL for its rows, so the publication publishes none of them and they would never be delivered. "+
		"Stop the application's writes to it; %s; send the rows it holds now, which were never in the WAL, with outboxd replay -table %s -where … (a condition selecting them); "+
		"then start outboxd", what, fix, e.Table)
}
