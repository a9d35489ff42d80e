package replay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/wal"
)

// table is what a replay reads of the outbox table's schema.
type table struct {
	name string // schema.table
	// rel is the table as pgoutput describes it to the daemon: its columns
	// in order, without generated columns (which pgoutput does not send),
	// each with its base type (pgoutput names a domain; the daemon's router
	// is built with its base type, router.Schema.Bases).
	rel      *wal.Relation
	types    map[string]uint32 // column → base type, for router.CheckTypes
	key      router.KeyColumn  // what the catalog says of router.key_column
	notNull  map[string]bool
	defaults map[string]string // column → its DEFAULT as Postgres prints it
	primary  []string          // the primary key's columns, in order
	leading  map[string]bool   // columns that lead an index
}

// readTable reads the schema of the table schema.table; keyColumn is
// router.key_column.
func readTable(ctx context.Context, conn *pgx.Conn, schema, name, keyColumn string) (table, error) {
	qualified := schema + "." + name
	t := table{name: qualified, types: map[string]uint32{}, notNull: map[string]bool{}, defaults: map[string]string{}, leading: map[string]bool{}}
	var oid uint32
	err := conn.QueryRow(ctx, `SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`, schema, name).Scan(&oid)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("table %s does not exist; -table names the outbox table to replay rows from (postgres.table)", qualified)
	}
	if err != nil {
		return t, fmt.Errorf("reading table %s: %w", qualified, err)
	}
	// outboxd delivers every row (logical decoding applies no row-level
	// security); a replay reading fewer would send an incomplete set.
	var rls bool
	if err := conn.QueryRow(ctx, `SELECT row_security_active($1::oid)`, oid).Scan(&rls); err != nil {
		return t, fmt.Errorf("reading the row security of %s: %w", qualified, err)
	}
	if rls {
		return t, fmt.Errorf("row-level security applies to the role of postgres.dsn on %s: a replay would see only the rows its policies show, "+
			"while outboxd delivers every row; replay as the table's owner or a role with BYPASSRLS", qualified)
	}
	// The base type of each column through domains, with the key column's
	// nullability, type modifier and default, as the daemon's start-up
	// check reads them for its router.
	rows, err := conn.Query(ctx, `WITH RECURSIVE b(num, name, oid, typmod, not_null, def, domain, generated) AS (
			SELECT a.attnum, a.attname::text, a.atttypid, a.atttypmod, a.attnotnull OR (t.typtype = 'd' AND t.typnotnull),
				coalesce(pg_get_expr(d.adbin, d.adrelid), ''), t.typtype = 'd', a.attgenerated <> ''
			FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
			LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
			WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped
			UNION ALL
			SELECT b.num, b.name, t.typbasetype, CASE WHEN b.typmod = -1 THEN t.typtypmod ELSE b.typmod END, b.not_null, b.def, b.domain, b.generated
			FROM b JOIN pg_type t ON t.oid = b.oid WHERE t.typtype = 'd')
		SELECT b.name, b.oid, b.typmod, b.not_null, b.def, b.domain, b.generated FROM b JOIN pg_type t ON t.oid = b.oid
		WHERE t.typtype <> 'd' ORDER BY b.num`, oid)
	if err != nil {
		return t, fmt.Errorf("reading the columns of %s: %w", qualified, err)
	}
	t.rel = &wal.Relation{ID: oid, Namespace: schema, Name: name}
	var col, def string
	var typ uint32
	var typmod int32
	var notNull, domain, generated bool
	_, err = pgx.ForEachRow(rows, []any{&col, &typ, &typmod, &notNull, &def, &domain, &generated}, func() error {
		t.types[col], t.notNull[col], t.defaults[col] = typ, notNull, def
		if col == keyColumn {
			t.key = router.KeyColumn{Optional: !notNull, TypeMod: typmod, Default: def, Domain: domain}
		}
		if !generated {
			t.rel.Columns = append(t.rel.Columns, wal.Column{Name: col, TypeOID: typ})
		}
		return nil
	})
	if err != nil {
		return t, fmt.Errorf("reading the columns of %s: %w", qualified, err)
	}
	rows, err = conn.Query(ctx, `SELECT a.attname::text FROM pg_index i, unnest(i.indkey::int2[]) WITH ORDINALITY k(num, pos)
		JOIN pg_attribute a ON a.attnum = k.num
		WHERE i.indrelid = $1::oid AND i.indisprimary AND a.attrelid = i.indrelid ORDER BY k.pos`, oid)
	if err != nil {
		return t, fmt.Errorf("reading the primary key of %s: %w", qualified, err)
	}
	if t.primary, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return t, fmt.Errorf("reading the primary key of %s: %w", qualified, err)
	}
	rows, err = conn.Query(ctx, `SELECT DISTINCT a.attname::text FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = $1::oid AND i.indpred IS NULL`, oid)
	if err != nil {
		return t, fmt.Errorf("reading the indexes of %s: %w", qualified, err)
	}
	leading, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return t, fmt.Errorf("reading the indexes of %s: %w", qualified, err)
	}
	for _, c := range leading {
		t.leading[c] = true
	}
	return t, nil
}

// newRouter returns the router the daemon routes t's rows with: built from
// cfg and what the catalog says of t's key column, as the daemon's is from
// its start-up checks (internal/preflight's checkColumnTypes), so that it
// refuses what the daemon would refuse.
func newRouter(cfg config.Router, t table) (*router.Router, error) {
	rt, err := router.New(cfg, router.Schema{Key: t.key})
	if err != nil {
		return nil, err
	}
	var present []string
	for _, c := range t.rel.Columns {
		present = append(present, c.Name)
	}
	if missing := pg.MissingColumns(present, router.Columns(cfg)); len(missing) > 0 {
		return nil, fmt.Errorf("outbox table %s has no column %s; add it or set the router.*_column settings to the table's column names",
			t.name, strings.Join(missing, ", "))
	}
	if err := rt.CheckTypes(t.name, t.types); err != nil {
		return nil, err
	}
	return rt, nil
}

// keyColumns returns the columns a run pages through t by: order (by
// default created_at when t has it, else the primary key), then the
// primary key's columns that are not order, which make the key unique.
func (t table) keyColumns(order string) ([]string, error) {
	if len(t.primary) == 0 {
		return nil, fmt.Errorf("table %s has no primary key; a replay reads it in pages ordered by -order and the primary key, "+
			"which makes each row's place unique: add a primary key (ALTER TABLE %s ADD PRIMARY KEY (...))", t.name, t.name)
	}
	switch _, ok := t.types[order]; {
	case order == "" && t.has("created_at"):
		order = "created_at"
	case order == "":
		return slices.Clone(t.primary), nil
	case !ok:
		return nil, fmt.Errorf("-order %s: table %s has no such column; name the column whose order the replay keeps for each key (default created_at, else the primary key)",
			order, t.name)
	}
	keys := []string{order}
	for _, c := range t.primary {
		if c != order {
			keys = append(keys, c)
		}
	}
	return keys, nil
}

func (t table) has(col string) bool {
	_, ok := t.types[col]
	return ok
}

// sharedDefault reports whether col's DEFAULT gives every row of one
// transaction the same value (now(), CURRENT_TIMESTAMP,
// transaction_timestamp()): rows of one transaction then tie on it, and
// the primary key, not the insert order, orders them.
func (t table) sharedDefault(col string) bool {
	d := strings.ToLower(t.defaults[col])
	return strings.Contains(d, "now()") || strings.Contains(d, "current_timestamp") || strings.Contains(d, "transaction_timestamp()")
}
