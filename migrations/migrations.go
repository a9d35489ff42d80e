package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed *.sql
var files embed.FS

// DefaultTable is the table name the SQL files are written for.
const DefaultTable = "public.outbox"

// SQL returns the migrations in order, for the table schema.table.
func SQL(schema, table string) ([]string, error) {
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	qualified := pgx.Identifier{schema, table}.Sanitize()
	var out []string
	for _, n := range names {
		b, err := files.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out = append(out, strings.ReplaceAll(string(b), DefaultTable, qualified))
	}
	return out, nil
}

// Apply runs every migration in one transaction. The statements are
// idempotent, so Apply may run again.
func Apply(ctx context.Context, conn *pgx.Conn, schema, table string) error {
	stmts, err := SQL(schema, table)
	if err != nil {
		return fmt.Errorf("reading migrations: %w", err)
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for i, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("applying migration %d to %s.%s: %w", i+1, schema, table, err)
			}
		}
		return nil
	})
}
