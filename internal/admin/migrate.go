package admin

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/router"
)

// Migrate creates or completes the outbox table of cfg (outboxd migrate):
// the migrations, with the column names the router reads. It logs the
// migrations it left out and the columns other settings read that the
// table lacks.
// With several postgres.tables it does so for each table, with the
// column names of its entry's router. With a pattern it installs the event
// trigger that adds the tables the pattern matches to the publication as
// they are created (pg.InstallTrigger), which needs a superuser, and adds
// those that exist and the publication lacks. Without a pattern it deletes
// the patterns recorded for the publication by an earlier run
// (pg.ForgetPatterns). It refuses, before it changes anything, to change
// the recorded patterns or to add tables while an outboxd streams the
// configuration's slot (pg.RefuseWhileStreaming).
func Migrate(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	per, err := cfg.PerTable()
	if err != nil {
		return err
	}
	conn, err := pg.Connect(ctx, cfg.Postgres)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Before anything changes: a running outboxd of the configuration
	// from before would pass over the rows of the tables this adds to
	// the publication (review-fix59 M1).
	if err := pg.RefuseWhileStreaming(ctx, conn, cfg.Postgres); err != nil {
		return err
	}
	for _, c := range per {
		if err := migrate(ctx, conn, c, log); err != nil {
			if cfg.Postgres.Several() {
				return fmt.Errorf("outbox table %s: %w", c.Postgres.Table, err)
			}
			return err
		}
	}
	if !cfg.Postgres.Patterns() {
		// Patterns recorded by an earlier run with patterns would have the
		// trigger go on adding their tables (review-patterns35 S2).
		return forgetPatterns(ctx, conn, cfg.Postgres.Publication, per, log)
	}
	// Tables a pattern matches are the application's to create; the
	// trigger adds each to the publication as it is created.
	added, err := pg.InstallTrigger(ctx, conn, cfg.Postgres)
	if err != nil {
		return err
	}
	log.Info("installed the event trigger that adds a table a pattern of postgres.tables matches to the publication as it is created",
		"trigger", pg.TriggerName, "publication", cfg.Postgres.Publication)
	if len(added) > 0 {
		log.Warn("added to the publication the tables that a pattern of postgres.tables matches and that it did not publish: their rows written before now are not delivered; "+
			"send those still pending with outboxd replay -table <table> -where … (postgres.backfill delivers a table's pending rows only with a single outbox table and a new slot). "+
			"Start outboxd with this configuration: one whose configuration does not list them passes over their rows and confirms past them",
			"publication", cfg.Postgres.Publication, "tables", strings.Join(added, ","))
	}
	// Another deployment's table: both would deliver it (review-fix59 S7).
	listed, err := pg.ListedElsewhere(ctx, conn, cfg.Postgres.Publication, added)
	if err != nil {
		return err
	}
	if len(listed) > 0 {
		log.Warn("added to the publication tables that other publications list by name: the outboxd of each delivers their rows, so they are delivered twice; "+
			"if another deployment owns them, make the patterns of postgres.tables not match them and remove them from this publication (ALTER PUBLICATION … DROP TABLE)",
			"publication", cfg.Postgres.Publication, "tables", strings.Join(listed, "; "))
	}
	// After the commit: their remedy depends on the patterns recorded.
	unlogged, err := pg.UnloggedMatching(ctx, conn, cfg.Postgres)
	if err != nil {
		return err
	}
	for _, ue := range unlogged {
		log.Warn("did not add to the publication a table that a pattern of postgres.tables matches, for it is UNLOGGED and no publication can publish it: outboxd refuses to start until it is logged",
			"publication", cfg.Postgres.Publication, "table", ue.Name(), "remedy", ue.Error())
	}
	for _, o := range cfg.Postgres.Overlaps() {
		log.Warn("two patterns of postgres.tables can match the same table, which takes the router settings of the first: "+
			"if that is not what you mean, narrow them, or list such a table by its exact name (an exact name comes before every pattern)",
			"first", fmt.Sprintf("postgres.tables[%d] (%s)", o[0], cfg.Postgres.Tables[o[0]].Name),
			"second", fmt.Sprintf("postgres.tables[%d] (%s)", o[1], cfg.Postgres.Tables[o[1]].Name))
	}
	return nil
}

// migrate is Migrate for the one table of cfg, on conn.
func migrate(ctx context.Context, conn *pgx.Conn, cfg config.Config, log *slog.Logger) error {
	schema, table := cfg.Postgres.TableName()
	// The table gets the column names the router reads (the debezium
	// preset's, or the *_column settings).
	rc := cfg.Router
	eventType := rc.EventTypeColumn
	if eventType == "-" {
		eventType = ""
	}
	cols := map[string]string{}
	seen := map[string]string{"created_at": "created_at"}
	for _, c := range []struct{ from, to, setting string }{
		{"id", rc.IDColumn, "id_column"}, {"aggregate_type", rc.RouteByColumn, "route_by_column"},
		{"aggregate_id", rc.KeyColumn, "key_column"}, {"event_type", eventType, "event_type_column"},
		{"payload", rc.PayloadColumn, "payload_column"},
	} {
		if c.from != c.to {
			cols[c.from] = c.to
		}
		if c.to == "" {
			continue
		}
		if other, ok := seen[c.to]; ok {
			return fmt.Errorf("router.%s and %s both name column %s, and a table cannot have two columns of one name; "+
				"create the outbox table yourself (migrations/0001_outbox.sql shows outboxd's) or give each setting its own column", c.setting, other, c.to)
		}
		seen[c.to] = "router." + c.setting
	}
	skipped, err := migrations.RunWith(ctx, conn, schema, table, migrations.Options{Columns: cols})
	if err != nil {
		return err
	}
	for _, s := range skipped {
		log.Warn("migration skipped", "migration", s.Migration, "table", cfg.Postgres.Table, "reason", s.Reason)
	}
	// Columns of other settings (timestamp, traceparent, headers,
	// additional fields) are not made: say which ones outboxd will miss.
	present, err := pg.TableColumns(ctx, conn, schema, table)
	if err != nil {
		return fmt.Errorf("reading the columns of %s: %w", cfg.Postgres.Table, err)
	}
	if missing := pg.MissingColumns(present, router.Columns(cfg.Router)); len(missing) > 0 {
		log.Warn("the router reads columns the table lacks; add them, or outboxd will not start", "table", cfg.Postgres.Table, "columns", strings.Join(missing, ","))
	}
	log.Info("outbox table ready", "table", cfg.Postgres.Table)
	return nil
}

// forgetPatterns deletes the patterns recorded for publication
// (pg.ForgetPatterns) and logs them, and the tables they added that stay
// in the publication and that no table of per is (review-fix59 S5), with
// the DROP TABLE that removes them.
func forgetPatterns(ctx context.Context, conn *pgx.Conn, publication string, per []config.Config, log *slog.Logger) error {
	forgot, matched, err := pg.ForgetPatterns(ctx, conn, publication)
	if err != nil || len(forgot) == 0 {
		return err
	}
	var left, quoted []string
	for _, m := range matched {
		if !slices.ContainsFunc(per, func(c config.Config) bool { s, t := c.Postgres.TableName(); return s == m.Schema && t == m.Table }) {
			left, quoted = append(left, m.Name()), append(quoted, pgx.Identifier{m.Schema, m.Table}.Sanitize())
		}
	}
	msg := "deleted the patterns recorded for the publication, which postgres.tables no longer has: the event trigger no longer adds the tables they match to it"
	if len(left) == 0 {
		log.Info(msg, "publication", publication, "patterns", strings.Join(forgot, ","))
		return nil
	}
	log.Warn(msg+"; the tables they added stay in the publication, which outboxd refuses at start-up with several postgres.tables and, with one, passes their rows over: "+
		"once their rows are delivered, remove them from it",
		"publication", publication, "patterns", strings.Join(forgot, ","), "tables", strings.Join(left, ","),
		"run", fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s", pgx.Identifier{publication}.Sanitize(), strings.Join(quoted, ", ")))
	return nil
}
