package replay

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/wal"
)

// Source is an outbox table as the daemon routes it, for a reader of its
// rows other than the stream (the backfill, package backfill).
type Source struct {
	Name     string         // schema.table
	Relation *wal.Relation  // the columns pgoutput sends, with their base types
	Router   *router.Router // the router the daemon routes the table's rows with
	// Keys are the columns the rows are paged by: order (when "",
	// created_at if the table has it, else the primary key), then the
	// primary key's columns that are not order.
	Keys    []string
	Primary []string // the primary key's columns
}

// OpenSource reads the schema of cfg's outbox table (postgres.table) on
// conn and builds its router and page keys.
func OpenSource(ctx context.Context, conn *pgx.Conn, cfg config.Config, order string) (Source, error) {
	schema, name := cfg.Postgres.TableName()
	t, err := readTable(ctx, conn, schema, name, cfg.Router.KeyColumn)
	if err != nil {
		return Source{}, err
	}
	rt, err := newRouter(cfg.Router, t)
	if err != nil {
		return Source{}, err
	}
	if order != "" && !t.has(order) {
		return Source{}, fmt.Errorf("table %s has no column %q; name a column of it, or none for the primary key", t.name, order)
	}
	if len(t.primary) == 0 {
		return Source{}, fmt.Errorf("table %s has no primary key, by which its rows are read in pages and told apart; add one (ALTER TABLE %s ADD PRIMARY KEY (...))", t.name, t.name)
	}
	if order == "" {
		// As the replay's default: created_at when the table has it. A
		// primary key of random UUIDs would put each key's events out of
		// their order.
		order = t.primary[0]
		if t.has("created_at") {
			order = "created_at"
		}
	}
	keys, err := t.keyColumns(order)
	if err != nil {
		return Source{}, err
	}
	return Source{Name: t.name, Relation: t.rel, Router: rt, Keys: keys, Primary: t.primary}, nil
}
