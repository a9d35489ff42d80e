package preflight

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/pg"
)

// refuseNested refuses postgres.tables that list a partitioned table and
// one of its partitions (at any depth). With publish_via_partition_root,
// which outboxd requires, the partition's rows are published under the
// parent's name and routed by the parent's entry, so the partition's own
// entry would be silently unused; and pg_publication_tables lists the
// parent only, so the start-up check would ask, on every start, for an
// ALTER PUBLICATION … ADD TABLE of the partition.
func (c *Checker) refuseNested(ctx context.Context, conn *pgx.Conn) error {
	if !c.cfg.Postgres.Several() {
		return nil
	}
	ts := c.tables()
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = pgx.Identifier{t.Schema, t.Name}.Sanitize()
	}
	var part, parent int
	err := conn.QueryRow(ctx, `SELECT p.i::int - 1, a.i::int - 1
		FROM unnest($1::text[]) WITH ORDINALITY AS p(name, i)
		CROSS JOIN unnest($1::text[]) WITH ORDINALITY AS a(name, i)
		CROSS JOIN LATERAL pg_partition_ancestors(to_regclass(p.name)) AS anc
		WHERE p.i <> a.i AND anc.relid <> to_regclass(p.name) AND anc.relid = to_regclass(a.name)
		ORDER BY p.i, a.i LIMIT 1`, names).Scan(&part, &parent)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the partitions of postgres.tables: %w", err)
	}
	return fmt.Errorf("postgres.tables[%d] %s is a partition of postgres.tables[%d] %s; list one of them: "+
		"the publication publishes the partition's rows under %[4]s's name, so they are routed by that entry's settings and the partition's entry would never apply",
		part, ts[part], parent, ts[parent])
}

// refuseUnlogged refuses an outbox table, exact or a pattern's, or any of
// its partitions at any depth, that is UNLOGGED (pg.RefuseUnlogged): its
// rows are in no WAL and would never be delivered (review-fix55 Must 1).
func (c *Checker) refuseUnlogged(ctx context.Context, conn *pgx.Conn) error {
	ts := c.tables()
	quoted, shown := make([]string, len(ts)), make([]string, len(ts))
	for i, t := range ts {
		quoted[i], shown[i] = pgx.Identifier{t.Schema, t.Name}.Sanitize(), t.String()
	}
	return pg.RefuseUnlogged(ctx, conn, quoted, shown)
}
