package migrations

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

//go:embed *.sql
var files embed.FS

// DefaultTable is the table name the SQL files are written for.
const DefaultTable = "public.outbox"

// defaultIndex is the name the SQL files give 0002's index; SQL derives the
// name from the table's instead.
const defaultIndex = "outbox_idempotency_key_idx"

// keyMigration is the migration of the optional idempotency key, the one
// that a table made before the run may not take (see keySkip).
const keyMigration = "0002_idempotency_key.sql"

// Skipped is a migration that Run left out, and why.
type Skipped struct {
	Migration string // the file name, such as 0002_idempotency_key.sql
	Reason    string // what is in the way and what to do instead
}

type migration struct{ name, sql string }

func load(schema, table string) ([]migration, error) {
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	r := strings.NewReplacer(
		DefaultTable, pgx.Identifier{schema, table}.Sanitize(),
		defaultIndex, pgx.Identifier{indexName(table)}.Sanitize(),
	)
	var out []migration
	for _, n := range names {
		b, err := files.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{name: n, sql: r.Replace(string(b))})
	}
	return out, nil
}

// SQL returns the migrations in order, for the table schema.table: the
// files with public.outbox replaced by that table and the index name of
// 0002 derived from the table's.
func SQL(schema, table string) ([]string, error) {
	ms, err := load(schema, table)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.sql
	}
	return out, nil
}

// maxIdentifier is Postgres' identifier length in bytes (NAMEDATALEN-1);
// it truncates longer names.
const maxIdentifier = 63

// indexName returns the name of the idempotency key index of table:
// <table>_idempotency_key_idx, or for a long table name its start, a hash
// of the whole name and the suffix, so that it is not truncated into
// another table's index name.
func indexName(table string) string {
	const suffix = "_idempotency_key_idx"
	if len(table)+len(suffix) <= maxIdentifier {
		return table + suffix
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(table))
	sum := fmt.Sprintf("_%08x", h.Sum32())
	keep := maxIdentifier - len(suffix) - len(sum)
	for keep > 0 && !utf8.RuneStart(table[keep]) {
		keep--
	}
	return table[:keep] + sum + suffix
}

// Run applies every migration to schema.table in one transaction and
// returns those it left out: a migration that a partitioned table cannot
// take (0002, whose unique index Postgres cannot build on one) is skipped,
// with the reason, rather than failing the others. The statements are
// idempotent, so Run may run again. The caller should report what was
// skipped.
func Run(ctx context.Context, conn *pgx.Conn, schema, table string) ([]Skipped, error) {
	return RunWith(ctx, conn, schema, table, Options{})
}

// Options adapt the migrations to the outbox table outboxd is configured
// for.
type Options struct {
	// Columns renames columns that 0001 creates, from its name (id,
	// aggregate_type, aggregate_id, event_type, payload) to the configured
	// one; "" leaves the column out.
	Columns map[string]string
}

// RunWith is Run with opts. Besides a partitioned table, it leaves 0002 out
// for a table that existed before it ran and lacks the idempotency key:
// building a unique index locks the table's writes while it builds, so the
// reason gives the statements to add it concurrently instead.
func RunWith(ctx context.Context, conn *pgx.Conn, schema, table string, opts Options) ([]Skipped, error) {
	ms, err := load(schema, table)
	if err != nil {
		return nil, fmt.Errorf("reading migrations: %w", err)
	}
	qualified := pgx.Identifier{schema, table}.Sanitize()
	var relkind string // "" when 0001 makes the table in this run
	err = conn.QueryRow(ctx, `SELECT coalesce((SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)), '')`, qualified).Scan(&relkind)
	if err != nil {
		return nil, fmt.Errorf("looking up %s.%s: %w", schema, table, err)
	}
	var skipped []Skipped
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		skipped = skipped[:0]
		for _, m := range ms {
			switch m.name {
			case "0001_outbox.sql":
				m.sql = renameColumns(m.sql, opts.Columns)
			case keyMigration:
				reason, err := keySkip(ctx, tx, schema, table, relkind)
				if err != nil {
					return fmt.Errorf("migration %s: %w", m.name, err)
				}
				if reason != "" {
					skipped = append(skipped, Skipped{Migration: m.name, Reason: reason})
					continue
				}
			}
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return fmt.Errorf("applying migration %s to %s.%s: %w", m.name, schema, table, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return skipped, nil
}

// keySkip says why 0002 is left out of schema.table, whose relkind before
// the run was relkind, or "" to apply it: always to a table the run made;
// to an older one only when its index is there already (after renaming an
// index of the old fixed name), for building it would lock the table's
// writes; never to a partitioned table, which cannot take the index.
func keySkip(ctx context.Context, tx pgx.Tx, schema, table, relkind string) (string, error) {
	qualified := pgx.Identifier{schema, table}.Sanitize()
	switch relkind {
	case "":
		return "", nil
	case "p":
		return "the table is partitioned, and Postgres cannot build a unique index on " +
			"idempotency_key alone on a partitioned table (a unique index must include the partition key), " +
			"so the table gets no idempotency key: leave outbox.Columns.IdempotencyKey empty " +
			"and let consumers deduplicate on the event id", nil
	}
	if err := renameLegacyIndex(ctx, tx, schema, table); err != nil {
		return "", err
	}
	var applied bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = to_regclass($1) AND c.relname = $2 AND i.indisvalid)`, qualified, indexName(table)).Scan(&applied)
	if err != nil {
		return "", fmt.Errorf("looking for its index on %s.%s: %w", schema, table, err)
	}
	if applied {
		return "", nil
	}
	return fmt.Sprintf("the table existed already, and building a unique index locks its writes while it builds; "+
		"to add the optional idempotency key, run ALTER TABLE %s ADD COLUMN IF NOT EXISTS idempotency_key text; "+
		"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS %s ON %s (idempotency_key)",
		qualified, pgx.Identifier{indexName(table)}.Sanitize(), qualified), nil
}

// renameColumns renames the column definitions of a CREATE TABLE (lines
// that start with four spaces and the column's name), or leaves them out.
func renameColumns(sql string, names map[string]string) string {
	lines := strings.Split(sql, "\n")
	out := lines[:0]
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, "    "); ok {
			col, def, _ := strings.Cut(rest, " ")
			if to, ok := names[col]; ok {
				if to == "" {
					continue
				}
				l = "    " + pgx.Identifier{to}.Sanitize() + " " + def
			}
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// Apply is Run for a caller that does not report skipped migrations.
func Apply(ctx context.Context, conn *pgx.Conn, schema, table string) error {
	_, err := Run(ctx, conn, schema, table)
	return err
}

// renameLegacyIndex gives the index that earlier versions of 0002 created
// under the fixed name outbox_idempotency_key_idx, on a table of another
// name, the name derived from the table's, so that 0002 finds it there
// instead of building a second unique index (and locking the table's
// writes while it does).
func renameLegacyIndex(ctx context.Context, tx pgx.Tx, schema, table string) error {
	name := indexName(table)
	if name == defaultIndex {
		return nil
	}
	var legacy, taken bool
	err := tx.QueryRow(ctx, `SELECT
		EXISTS (SELECT FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
			WHERE i.indrelid = to_regclass($1) AND c.relname = $2),
		EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $3 AND c.relname = $4)`,
		pgx.Identifier{schema, table}.Sanitize(), defaultIndex, schema, name).Scan(&legacy, &taken)
	if err != nil {
		return fmt.Errorf("looking for index %s on %s.%s: %w", defaultIndex, schema, table, err)
	}
	if !legacy || taken {
		return nil
	}
	if _, err := tx.Exec(ctx, "ALTER INDEX "+pgx.Identifier{schema, defaultIndex}.Sanitize()+" RENAME TO "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("renaming index %s.%s to %s: %w", schema, defaultIndex, name, err)
	}
	return nil
}
