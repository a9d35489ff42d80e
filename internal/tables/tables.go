// Package tables tells the outbox table's changes from those of other
// tables that the publication also publishes, by relation ID and the
// catalogue, and learns the base types of the outbox columns' domains. One
// Outbox serves one pipeline run: only its goroutine may use it, and it
// reads the catalogue of the server the run streams from, nowhere else.
package tables

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/wal"
)

// Outbox tells the outbox table's changes from those of other tables
// that the publication also publishes. Matching the name alone is not
// enough: a table renamed while outboxd runs keeps its relation ID under a
// new name, and a publication without publish_via_partition_root (outboxd
// refuses one at start-up, but it may have been one for the WAL still in
// the slot) publishes a partition's rows under the partition's name. Those
// rows are outbox events; dropping them would confirm them undelivered.
// Tables that inherit from the outbox table are other tables.
type Outbox struct {
	publication string
	schema      string
	table       string
	log         *slog.Logger

	outboxID uint32          // the outbox's relation ID: read when the run started, then as seen
	others   map[uint32]bool // relation ID → its rows are outbox rows
	db       pg.Lazy         // for the lookups

	// pgoutput names a column's declared type, which for a domain is the
	// domain. Its base type tells how to read the value (a domain over bytea
	// is sent as hex text): baseType learns each domain's.
	baseType func(domain, base uint32) error
	typed    *wal.Relation   // the last outbox relation whose types were looked at
	types    map[uint32]bool // user-defined type OIDs already looked up
}

// New returns the Outbox of a run that streams from the server at addr
// (pg.Addr; "" for any host of postgres.dsn), starting from outboxID, the
// outbox table's relation ID when the run started (0 if unknown). baseType
// is told each domain's base type as the run meets it; its error fails Has.
func New(pgc config.Postgres, log *slog.Logger, outboxID uint32, addr string, baseType func(domain, base uint32) error) *Outbox {
	schema, table := pgc.TableName()
	return &Outbox{publication: pgc.Publication, schema: schema, table: table, log: log, outboxID: outboxID, others: map[uint32]bool{},
		db: pg.Lazy{PG: pgc, Addr: addr}, baseType: baseType, types: map[uint32]bool{}}
}

// Addr is the server whose catalogue it reads (pg.Addr).
func (t *Outbox) Addr() string { return t.db.Addr }

// Has reports whether rel's rows are outbox rows. A relation of another name
// is looked up in the catalog once per run, and so are the outbox's
// user-defined column types.
func (t *Outbox) Has(ctx context.Context, rel *wal.Relation) (bool, error) {
	ours, err := t.is(ctx, rel)
	if ours && err == nil && rel != t.typed {
		err = t.resolveTypes(ctx, rel)
	}
	return ours, err
}

func (t *Outbox) is(ctx context.Context, rel *wal.Relation) (bool, error) {
	if rel.Namespace == t.schema && rel.Name == t.table {
		t.outboxID = rel.ID
		return true, nil
	}
	if rel.ID == t.outboxID {
		return true, nil
	}
	if ours, ok := t.others[rel.ID]; ok {
		return ours, nil
	}
	exists, ours, err := t.lookup(ctx, rel.ID)
	if err != nil {
		return false, fmt.Errorf("looking up %s (relation %d), which the publication publishes, to tell whether it is a partition of the outbox table %s.%s: %w",
			rel.QualifiedName(), rel.ID, t.schema, t.table, err)
	}
	t.others[rel.ID] = ours
	switch {
	case ours:
		t.log.Info("delivering the rows of "+rel.QualifiedName()+" as outbox events: it is a partition of the outbox table, "+
			"published under its own name (the publication lacked publish_via_partition_root where this part of the WAL was written)",
			"table", t.schema+"."+t.table)
	case !exists:
		t.log.Warn("ignoring the changes to "+rel.QualifiedName()+", a table dropped since: if it was a partition of the outbox table, "+
			"its events in this part of the WAL are not delivered (they were published under its own name; publish_via_partition_root prevents this)",
			"relation", rel.ID, "publication", t.publication)
	default:
		t.log.Info("ignoring the changes to "+rel.QualifiedName()+": the publication publishes it, but it is not the outbox table. "+
			"A publication of the outbox table alone spares Postgres decoding them", "publication", t.publication)
	}
	return ours, nil
}

// firstUserOID is Postgres' FirstNormalObjectId: built-in types are below it.
const firstUserOID = 16384

// resolveTypes looks up the base type of each domain among rel's column
// types that it has not seen yet.
func (t *Outbox) resolveTypes(ctx context.Context, rel *wal.Relation) error {
	var oids []uint32
	for _, c := range rel.Columns {
		if c.TypeOID >= firstUserOID && !t.types[c.TypeOID] {
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
		_, err = pgx.ForEachRow(rows, []any{&domain, &base}, func() error { return t.baseType(domain, base) })
		if err != nil {
			return fmt.Errorf("looking up the column types of %s: %w", rel.QualifiedName(), err)
		}
		for _, oid := range oids {
			t.types[oid] = true
		}
	}
	t.typed = rel
	return nil
}

// lookup reports whether relation id exists and whether it is a partition
// of the outbox table (by its configured name or its ID), at any depth.
func (t *Outbox) lookup(ctx context.Context, id uint32) (exists, partition bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := t.db.Get(ctx)
	if err != nil {
		return false, false, err
	}
	err = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class WHERE oid = $1::oid),
			EXISTS (SELECT 1 FROM pg_partition_ancestors($1::oid::regclass) a
				WHERE a.relid::oid <> $1::oid AND (a.relid::oid = to_regclass($2)::oid OR a.relid::oid = $3::oid))`,
		id, pgx.Identifier{t.schema, t.table}.Sanitize(), t.outboxID).Scan(&exists, &partition)
	return exists, partition, err
}

// Close closes the connection of the lookups.
func (t *Outbox) Close() { t.db.Close() }
