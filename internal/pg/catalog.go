package pg

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Kinds of a refused outbox table: the Kind of the *wal.Error a table
// check returns (preflight.CheckOutbox), which a caller tells apart with
// errors.Is. Neither says anything of the table's columns.
var (
	// ErrNoTable: no table has the name.
	ErrNoTable = errors.New("no table has the outbox table's name")
	// ErrNoPrivilege: the role lacks USAGE on the table's schema or
	// SELECT on the table.
	ErrNoPrivilege = errors.New("the role may not read the outbox table")
)

// ServerMajor returns the server's major version and its version string.
func ServerMajor(ctx context.Context, conn *pgx.Conn) (int, string, error) {
	var num int
	var version string
	err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('server_version')`).Scan(&num, &version)
	if err != nil {
		return 0, "", fmt.Errorf("reading the server version: %w", err)
	}
	return num / 10000, version, nil
}

// SystemID returns the system identifier of the server's database cluster
// (pg_control_system), which a standby shares with its primary and a
// pg_upgrade or initdb changes; "" when it cannot be read.
func SystemID(ctx context.Context, conn *pgx.Conn) string {
	var id string
	if conn.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&id) != nil {
		return ""
	}
	return id
}

// TableColumns returns the column names of the table (or partitioned
// table) schema.table, or pgx.ErrNoRows when there is none.
func TableColumns(ctx context.Context, conn *pgx.Conn, schema, table string) ([]string, error) {
	var present []string
	err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(a.attname::text), '{}') FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')
		HAVING count(c.oid) > 0`, schema, table).Scan(&present)
	return present, err
}

// MissingColumns returns the names in want that present lacks.
func MissingColumns(present, want []string) []string {
	var missing []string
	for _, c := range want {
		if !slices.Contains(present, c) {
			missing = append(missing, c)
		}
	}
	return missing
}
