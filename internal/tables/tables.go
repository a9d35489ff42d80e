// Package tables tells which outbox table a change is of, from the changes
// of other tables that the publication also publishes, by relation ID and
// the catalogue, and learns the base types of the outbox columns' domains. One
// Outbox serves one pipeline run: only its goroutine may use it, and it
// reads the catalogue of the server the run streams from, nowhere else.
package tables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/wal"
)

// Outbox tells each outbox table's changes from those of other tables
// that the publication also publishes, and which outbox table a change is
// of. Matching the name alone is not enough: a table renamed while outboxd
// runs keeps its relation ID under a new name, and a publication without
// publish_via_partition_root (outboxd refuses one at start-up, but it may
// have been one for the WAL still in the slot) publishes a partition's rows
// under the partition's name. Those rows are outbox events; dropping them
// would confirm them undelivered. Tables that inherit from an outbox table
// are other tables.
//
// With one outbox table, another table's changes are ignored: the
// publication may be shared. With several (postgres.tables), outboxd owns
// the publication (the start-up checks refuse one that publishes another
// table), and a change of a table that is none of the outbox tables, nor a
// partition of one, is an error that names the table: it cannot be routed,
// and passing it over could drop an event.
type Outbox struct {
	publication string
	tables      []table
	several     bool
	log         *slog.Logger

	others map[uint32]int // relation ID → the outbox table whose partition it is, or -1
	db     pg.Lazy        // for the lookups
	// find replaces lookup when set (tests stub the catalogue).
	find func(ctx context.Context, id uint32) (exists bool, table int, err error)

	// pgoutput names a column's declared type, which for a domain is the
	// domain. Its base type tells how to read the value (a domain over bytea
	// is sent as hex text): baseType learns each domain's, per table.
	baseType func(table int, domain, base uint32) error
	typed    *wal.Relation // the last outbox relation whose types were looked at

	// entries are postgres.tables; adopt takes on a table that a pattern
	// among them matches and that was none of the tables when the run
	// started (Adopt).
	entries []config.TableEntry
	adopt   Adopt
}

// Adopt checks the table name (schema.table), which entry of
// postgres.tables (a pattern) matches, on conn, as the start-up checks do,
// and builds its router from the entry's settings, as the next of the
// outbox tables. Its error stops the run; an error that is not a server's
// or the connection's is permanent: outboxd's role may not read the table
// (pg.ErrNoPrivilege: ErrUnreadable, whose remedy is the GRANT), or else
// the table does not fit the entry (ErrUnfit).
// id is its relation ID, 0 when not known (a logical message named it).
type Adopt func(ctx context.Context, conn *pgx.Conn, entry int, name string, id uint32) error

// ErrUnfit marks a table that a pattern matches and whose columns do not
// fit the pattern entry's router settings; it is permanent.
var ErrUnfit error = permanent("a table a pattern matches does not fit its entry's router settings")

// ErrUnreadable marks a table that a pattern matches, created while
// outboxd runs, that outboxd's role may not read (USAGE on its schema,
// SELECT on it); it is permanent, as a privilege refused at start-up is.
var ErrUnreadable error = permanent("outboxd's role may not read a table a pattern matches")

// table is one outbox table.
type table struct {
	schema, name string
	id           uint32          // its relation ID: read when the run started, then as seen
	types        map[uint32]bool // user-defined type OIDs of its columns already looked up
}

func (t *table) qualified() string { return t.schema + "." + t.name }

// New returns the Outbox of a run that streams from the server at addr
// (pg.Addr; "" for any host of postgres.dsn). per are the outbox tables'
// configurations (config.Config.PerTable) and ids their relation IDs when
// the run started (0 if unknown), in the same order. baseType is told each
// domain's base type, with the index of the table whose column has it, as
// the run meets it; its error fails Which.
//
// adopt (nil: none) takes on a table created while the run streams that a
// pattern of pgc.Tables matches, the first time a change of it is met.
func New(pgc config.Postgres, per []config.Config, ids []uint32, log *slog.Logger, addr string, baseType func(table int, domain, base uint32) error, adopt Adopt) *Outbox {
	ts := make([]table, len(per))
	for i, c := range per {
		schema, name := c.Postgres.TableName()
		ts[i] = table{schema: schema, name: name, types: map[uint32]bool{}}
		if i < len(ids) {
			ts[i].id = ids[i]
		}
	}
	return &Outbox{publication: pgc.Publication, tables: ts, several: len(ts) > 1 || pgc.Several(), log: log, others: map[uint32]int{},
		db: pg.Lazy{PG: pgc, Addr: addr}, baseType: baseType, entries: pgc.Tables, adopt: adopt}
}

// Addr is the server whose catalogue it reads (pg.Addr).
func (t *Outbox) Addr() string { return t.db.Addr }

// Which reports which outbox table rel's rows are of: its index in the
// tables New was given, or ok false for another table (one outbox table
// only; with several, that is an error). A relation of another name is
// looked up in the catalogue once per run, and so are each outbox table's
// user-defined column types.
func (t *Outbox) Which(ctx context.Context, rel *wal.Relation) (i int, ok bool, err error) {
	i, err = t.which(ctx, rel)
	if i < 0 || err != nil {
		return 0, false, err
	}
	if rel != t.typed {
		if err := t.resolveTypes(ctx, i, rel); err != nil {
			return 0, false, err
		}
	}
	return i, true, nil
}

func (t *Outbox) which(ctx context.Context, rel *wal.Relation) (int, error) {
	for i := range t.tables {
		if tb := &t.tables[i]; rel.Namespace == tb.schema && rel.Name == tb.name {
			if tb.id != rel.ID {
				t.idChanged(i, rel)
			}
			tb.id = rel.ID
			return i, nil
		}
	}
	for i := range t.tables {
		if rel.ID == t.tables[i].id {
			return i, nil
		}
	}
	if i, ok := t.others[rel.ID]; ok {
		return i, nil
	}
	find := t.lookup
	if t.find != nil {
		find = t.find
	}
	exists, i, err := find(ctx, rel.ID)
	if err != nil {
		return -1, fmt.Errorf("looking up %s (relation %d), which the publication publishes, to tell whether it is a partition of an outbox table (%s): %w",
			rel.QualifiedName(), rel.ID, t.names(), err)
	}
	if j, ok := t.patternOf(rel.Namespace, rel.Name); i < 0 && ok && t.adopt != nil {
		if !exists {
			return -1, t.gone(rel, j, "that table was dropped after the row was written, before outboxd delivered it")
		}
		return t.adoptTable(ctx, rel, j)
	}
	if i < 0 && t.several {
		what := "which is none of postgres.tables nor a partition of one"
		if !exists {
			what = "a table dropped since, which outboxd cannot tell for a partition of one of postgres.tables or another table"
		}
		return -1, &wal.Error{Kind: ErrUnrouted,
			Msg: fmt.Sprintf("publication %q published a row of %s (relation %d), %s: outboxd has no router for it and stopped rather than pass it over",
				t.publication, rel.QualifiedName(), rel.ID, what),
			Remedy: "if its rows are outbox events, list " + rel.QualifiedName() + " under postgres.tables and restart. If they are not, remove it from the publication; " +
				"the rows already in the slot are published still, and the only way past them is to advance the slot by hand (pg_replication_slot_advance) " +
				"to the end of the transaction named here. That skips every event before it which outboxd has not confirmed (the slot's confirmed_flush_lsn), " +
				"this transaction's rows of the outbox tables included: publish those again with outboxd replay after the advance"}
	}
	t.others[rel.ID] = i
	switch {
	case i >= 0:
		t.log.Info("delivering the rows of "+rel.QualifiedName()+" as outbox events: it is a partition of the outbox table, "+
			"published under its own name (the publication lacked publish_via_partition_root where this part of the WAL was written)",
			"table", t.tables[i].qualified())
	case !exists:
		t.log.Warn("ignoring the changes to "+rel.QualifiedName()+", a table dropped since: if it was a partition of the outbox table, "+
			"its events in this part of the WAL are not delivered (they were published under its own name; publish_via_partition_root prevents this)",
			"relation", rel.ID, "publication", t.publication)
	default:
		// Warn: a table added to the publication ahead of listing it loses
		// the rows this run passes over (docs/configuration.md, "Adding a
		// table").
		t.log.Warn("ignoring the changes to "+rel.QualifiedName()+": the publication publishes it, but it is not the outbox table. "+
			"If it is an outbox table you mean to list under postgres.tables, the rows outboxd passes over now are never delivered: "+
			"stop outboxd before you add a table to the publication", "publication", t.publication)
	}
	return i, nil
}

// Owner reports which outbox table a logical message that names owner
// (schema.table, its __outbox_table) is of, when it is none of the tables
// the run has met but a pattern entry matches it: that table is adopted
// as a row of it would be (its relation ID is learnt from its first row).
// ok is false when no pattern matches owner.
func (t *Outbox) Owner(ctx context.Context, owner string) (i int, ok bool, err error) {
	for i := range t.tables {
		if t.tables[i].qualified() == owner {
			return i, true, nil
		}
	}
	schema, name, cut := strings.Cut(owner, ".")
	if !cut || t.adopt == nil {
		return 0, false, nil
	}
	if j, ok := t.patternOf(schema, name); ok {
		i, err := t.adoptTable(ctx, &wal.Relation{Namespace: schema, Name: name}, j)
		return i, err == nil, err
	}
	return 0, false, nil
}

// patternOf returns the entry of postgres.tables, a pattern, whose router
// settings the table schema.name takes (config.Postgres.EntryOf: the first
// pattern that matches it, as at start-up), or ok false.
func (t *Outbox) patternOf(schema, name string) (int, bool) {
	j, ok := config.Postgres{Tables: t.entries}.EntryOf(schema, name)
	return j, ok && t.entries[j].Pattern()
}

// adoptTable takes on rel, a table that entry j of postgres.tables, a
// pattern, matches, and returns its index among the tables.
func (t *Outbox) adoptTable(ctx context.Context, rel *wal.Relation, j int) (int, error) {
	name := rel.QualifiedName()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var conn *pgx.Conn // nil with a stubbed catalogue (find)
	if t.find == nil {
		var err error
		if conn, err = t.db.Get(ctx); err != nil {
			return -1, fmt.Errorf("checking %s, a new table of postgres.tables[%d] (%s): %w", name, j, t.entries[j].Name, err)
		}
	}
	if err := t.adopt(ctx, conn, j, rel.Namespace+"."+rel.Name, rel.ID); err != nil {
		// halt is the permanent error: the table is there, but why says
		// outboxd cannot take it on.
		halt := func(kind error, why, remedy string) error {
			return &wal.Error{Kind: kind,
				Msg: fmt.Sprintf("publication %q published a row of %s (relation %d), created while outboxd ran, which postgres.tables[%d] (%s) matches, but %s: %v; "+
					"outboxd stopped rather than pass its rows over", t.publication, name, rel.ID, j, t.entries[j].Name, why, err),
				Remedy: remedy}
		}
		var pgErr *pgconn.PgError
		switch {
		case errors.Is(err, pg.ErrNoPrivilege):
			// Not the table's shape: a GRANT puts it right.
			return -1, halt(ErrUnreadable, "outboxd's role may not read it",
				"run the GRANT above as the table's owner or a superuser and start outboxd again: the rows are delivered then. So that the tables created later are readable "+
					"at once, have each role that creates them (or a superuser, with FOR ROLE that role) run, once: ALTER DEFAULT PRIVILEGES GRANT USAGE ON SCHEMAS TO <outboxd's role>; "+
					"ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO <outboxd's role> (docs/configuration.md, \"Tables created while outboxd runs\")")
		case errors.Is(err, pg.ErrNoTable) && rel.ID == 0:
			return -1, t.gone(rel, j, "no table has that name: it was renamed or dropped after the message was written, before outboxd delivered it, "+
				"or the message's "+router.OwnerField+" names a table that never was")
		case errors.Is(err, pg.ErrNoTable):
			return -1, t.gone(rel, j, "no table has that name any more: it was renamed (or dropped) after the row was written, before outboxd delivered it")
		case errors.As(err, &pgErr) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) || ctx.Err() != nil || (conn != nil && conn.IsClosed()):
			return -1, fmt.Errorf("checking %s, a new table of postgres.tables[%d] (%s): %w", name, j, t.entries[j].Name, err)
		}
		return -1, halt(ErrUnfit, "it does not fit that entry",
			"list the table by its exact name under postgres.tables, with router settings its columns fit (an exact name comes before every pattern), "+
				"and start outboxd again: its rows, those already written included, are routed by that entry. Adding the missing columns (ALTER TABLE) "+
				"does not help the rows already written, which are decoded with the columns they were written with")
	}
	t.tables = append(t.tables, table{schema: rel.Namespace, name: rel.Name, id: rel.ID, types: map[uint32]bool{}})
	t.log.Info("delivering the rows of "+name+", created while outboxd runs, as outbox events of postgres.tables["+fmt.Sprint(j)+"] ("+t.entries[j].Name+")",
		"relation", rel.ID, "publication", t.publication)
	return len(t.tables) - 1, nil
}

// gone is the error for a row (or, with no relation ID, a logical
// message) of rel, a table that entry j of postgres.tables, a pattern,
// matches, whose name no table has any more, as what says: outboxd cannot
// check it against the entry. The way on that loses nothing is to give
// the name back to a table of its columns.
func (t *Outbox) gone(rel *wal.Relation, j int, what string) error {
	name := rel.QualifiedName()
	of := fmt.Sprintf("publication %q published a row of %s (relation %d)", t.publication, name, rel.ID)
	if rel.ID == 0 {
		of = "a logical message names " + name
	}
	return &wal.Error{Kind: ErrUnrouted,
		Msg: fmt.Sprintf("%s, which postgres.tables[%d] (%s) matches, but %s: outboxd cannot check it against that entry, "+
			"and stopped rather than pass its rows over", of, j, t.entries[j].Name, what),
		Remedy: "to deliver its rows, give the name " + name + " back to a table of the same columns: rename the table back, or create it again " +
			"(CREATE TABLE; the event trigger publishes it), and start outboxd again. Once outboxd has confirmed past these rows (outboxd status), " +
			"drop or rename it again: outboxd stops checking a table of a pattern that is dropped while it runs. " +
			"To pass them over instead, which loses them, advance the slot by hand (pg_replication_slot_advance) to the end of the transaction named here: " +
			"that skips every event before it that outboxd has not confirmed (the slot's confirmed_flush_lsn), the other outbox tables' included"}
}

// ErrUnrouted marks a row of a table that is none of several outbox tables;
// it is permanent.
var ErrUnrouted error = permanent("a row of a table that is not an outbox table")

// permanent is a sentinel error that classifies itself as permanent: a
// restart would meet the same row.
type permanent string

func (p permanent) Error() string   { return string(p) }
func (p permanent) Permanent() bool { return true }

// names are the outbox tables' names, comma-separated.
func (t *Outbox) names() string {
	names := make([]string, len(t.tables))
	for i := range t.tables {
		names[i] = t.tables[i].qualified()
	}
	return strings.Join(names, ",")
}

// firstUserOID is Postgres' FirstNormalObjectId: built-in types are below it.
const firstUserOID = 16384

// resolveTypes looks up the base type of each domain among rel's column
// types that it has not seen yet.
func (t *Outbox) resolveTypes(ctx context.Context, table int, rel *wal.Relation) error {
	types := t.tables[table].types
	var oids []uint32
	for _, c := range rel.Columns {
		if c.TypeOID >= firstUserOID && !types[c.TypeOID] {
			oids = append(oids, c.TypeOID)
		}
	}
	if len(oids) > 0 {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		conn, err := t.db.Get(ctx)
		if err != nil {
			return fmt.Errorf("looking up the column types of %s: %w", rel.QualifiedName(), err)
		}
		rows, err := conn.Query(ctx, `WITH RECURSIVE dom(oid, base) AS (
				SELECT oid, typbasetype FROM pg_type WHERE oid = ANY($1) AND typtype = 'd'
				UNION ALL SELECT dom.oid, t.typbasetype FROM dom JOIN pg_type t ON t.oid = dom.base AND t.typtype = 'd')
			SELECT oid, base FROM dom WHERE NOT EXISTS (SELECT 1 FROM pg_type t WHERE t.oid = dom.base AND t.typtype = 'd')`, oids)
		if err != nil {
			return fmt.Errorf("looking up the column types of %s: %w", rel.QualifiedName(), err)
		}
		var domain, base uint32
		_, err = pgx.ForEachRow(rows, []any{&domain, &base}, func() error { return t.baseType(table, domain, base) })
		if err != nil {
			return fmt.Errorf("looking up the column types of %s: %w", rel.QualifiedName(), err)
		}
		for _, oid := range oids {
			types[oid] = true
		}
	}
	t.typed = rel
	return nil
}

// lookup reports whether relation id exists and which outbox table, by its
// configured name or its ID, it is a partition of, at any depth (-1: none).
func (t *Outbox) lookup(ctx context.Context, id uint32) (exists bool, table int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := t.db.Get(ctx)
	if err != nil {
		return false, -1, err
	}
	names := make([]string, len(t.tables))
	ids := make([]uint32, len(t.tables))
	for i := range t.tables {
		names[i] = pgx.Identifier{t.tables[i].schema, t.tables[i].name}.Sanitize()
		ids[i] = t.tables[i].id
	}
	var index int32
	err = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class WHERE oid = $1::oid),
			coalesce((SELECT min(u.i) FROM pg_partition_ancestors($1::oid::regclass) a,
					unnest($2::text[], $3::oid[]) WITH ORDINALITY AS u(name, id, i)
				WHERE a.relid::oid <> $1::oid AND (a.relid::oid = to_regclass(u.name)::oid OR a.relid::oid = u.id)), 0)::int - 1`,
		id, names, ids).Scan(&exists, &index)
	return exists, int(index), err
}

// Close closes the connection of the lookups.
func (t *Outbox) Close() { t.db.Close() }
