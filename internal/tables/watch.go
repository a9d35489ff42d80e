package tables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/internal/quote"
	"github.com/outboxd/outboxd/wal"
)

// ErrUnpublished marks an outbox table that the publication no longer
// publishes under its name, or a table a pattern of postgres.tables
// matches that it does not publish; it is permanent.
var ErrUnpublished error = permanent("an outbox table is not published")

// ErrTrigger marks the event trigger that adds the tables a pattern of
// postgres.tables matches to the publication found missing, disabled, not
// enabled always, changed, or knowing other patterns while outboxd
// streams; it is permanent.
var ErrTrigger error = permanent("the event trigger of the patterns of postgres.tables is not as outboxd migrate installed it")

// Watch checks, while a run streams, that each outbox table is still the
// table the publication publishes. A FOR TABLE publication names a table
// by its relation, not by its name: a table dropped and created again, or
// another table renamed to its name (the "build new, swap names" pattern),
// is a new relation that the publication does not have, and Postgres puts
// none of its rows into the slot. Nothing on the stream shows it, so
// outboxd would go on confirming past rows it never sees. Watch reads the
// catalogue instead, on one connection of its own to the run's server,
// and ends the run naming the table.
//
// A table renamed while outboxd runs keeps its relation, which the
// publication still publishes: its rows go on flowing, and Watch lets it
// be (the next start refuses the configured name).
//
// Tables learnt while the run streams (a table created that matches a
// pattern) join the check through Add. A table of a pattern that is
// dropped, with nothing of its name in its place, leaves the check instead
// of ending the run: for a tenant's table that is its life's end, and its
// rows written before the drop are in the slot, under a relation the run
// knows. A table listed by its exact name ends the run.
//
// With a pattern in postgres.tables, each check also reads the event
// trigger and the tables the patterns match (pg.WatchPatterns): a
// matching table the publication lacks ends the run naming it, for no
// row of it reaches the slot (the trigger was disabled or dropped,
// event_triggers = off, or it was removed from the publication by hand),
// and so does a trigger no longer as outboxd migrate installed it, for the
// next table created would be one (review-patterns35 S1).
type Watch struct {
	publication string
	cfg         config.Postgres // for the patterns of postgres.tables
	db          pg.Lazy
	log         *slog.Logger

	mu      sync.Mutex // guards the four lists, which Add extends while Run runs
	names   []string   // quoted, for to_regclass
	shown   []string   // schema.table, for messages
	ids     []uint32   // relation IDs when the run started, or when Add learnt them (0: unknown)
	pattern []bool     // a table a pattern of postgres.tables gave, not an exact name

	// dropped are the tables of patterns that the last check found
	// dropped: found so twice in a row, a table leaves the check (one
	// read may meet a swap half done). Check's own.
	dropped map[string]bool
}

// NewWatch returns the Watch of a run on the server at addr (pg.Addr),
// for the outbox tables per (config.Config.PerTable) whose relation IDs
// were ids when the run started.
func NewWatch(pgc config.Postgres, per []config.Config, ids []uint32, addr string, log *slog.Logger) *Watch {
	w := &Watch{publication: pgc.Publication, cfg: pgc, db: pg.Lazy{PG: pgc, Addr: addr}, log: log}
	for i, c := range per {
		schema, name := c.Postgres.TableName()
		var id uint32
		if i < len(ids) {
			id = ids[i]
		}
		j, ok := pgc.EntryOf(schema, name)
		w.add(schema, name, id, ok && pgc.Tables[j].Pattern())
	}
	return w
}

// Add makes the Watch check one more outbox table, schema.name, whose
// relation ID is id (0: unknown), from the next check on: a table that a
// pattern of postgres.tables matches, created while the run streams. A
// table the Watch already checks is left as it is. It is safe to call
// while Run runs.
//
// From then on its name must stay a relation the publication publishes;
// dropped, with nothing of its name in its place, it leaves the check.
func (w *Watch) Add(schema, name string, id uint32) { w.add(schema, name, id, true) }

func (w *Watch) add(schema, name string, id uint32, pattern bool) {
	shown := schema + "." + name
	w.mu.Lock()
	defer w.mu.Unlock()
	if slices.Contains(w.shown, shown) {
		return
	}
	w.names = append(w.names, pgx.Identifier{schema, name}.Sanitize())
	w.shown = append(w.shown, shown)
	w.ids = append(w.ids, id)
	w.pattern = append(w.pattern, pattern)
}

// forget stops checking the table shown as name (schema.table).
func (w *Watch) forget(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	i := slices.Index(w.shown, name)
	if i < 0 {
		return
	}
	// New slices: a list read before stays as it was.
	w.names = slices.Delete(slices.Clone(w.names), i, i+1)
	w.shown = slices.Delete(slices.Clone(w.shown), i, i+1)
	w.ids = slices.Delete(slices.Clone(w.ids), i, i+1)
	w.pattern = slices.Delete(slices.Clone(w.pattern), i, i+1)
	w.log.Info("no longer checking that "+name+" is published: a table of a pattern of postgres.tables, dropped while outboxd ran (its rows written before the drop are delivered as the stream reaches them)",
		"publication", w.publication)
}

// list returns the tables the next check reads: quoted names, the names
// shown in messages, the relation IDs, and which a pattern gave.
func (w *Watch) list() (names, shown []string, ids []uint32, pattern []bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.names, w.shown, w.ids, w.pattern // Add only appends, forget copies: a reader's slices stay as they were
}

// Run checks every interval until ctx ends, and returns the first
// table found unpublished (ErrUnpublished), or the event trigger found
// changed (ErrTrigger), or an outbox table or a partition of one found
// UNLOGGED (ErrUnlogged). A failed read is logged, at
// most once a minute, and tried again at the next tick: the stream
// reports a lost server itself.
func (w *Watch) Run(ctx context.Context, every time.Duration) error {
	defer w.db.Close()
	tick := time.NewTicker(every)
	defer tick.Stop()
	var warned time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		err := w.Check(ctx)
		if isFinding(err) {
			// Postgres may read the catalogue at two moments within one
			// query, so a read that meets a DROP or a swap as it commits
			// can mix the two states: read again to name what is so.
			err = w.Check(ctx)
		}
		switch {
		case err == nil, ctx.Err() != nil:
		case isFinding(err):
			return err
		case time.Since(warned) >= time.Minute:
			warned = time.Now()
			w.log.Warn("checking that the outbox tables are still published; trying again", "err", err, "publication", w.publication)
		}
	}
}

// isFinding reports what ends the run: not a failed read.
func isFinding(err error) bool {
	e, ok := err.(*wal.Error)
	return ok && (e.Kind == ErrUnpublished || e.Kind == ErrTrigger || e.Kind == ErrUnlogged)
}

// watchQuery reads, for each table by its quoted name and its relation ID
// at the run's start: its relation now, whether the start's relation still
// exists, and whether the publication publishes the relation now under
// the name (a partitioned table with publish_via_partition_root appears
// as itself). exists says whether the publication is there at all (its
// loss is the stream's to report).
const watchQuery = `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
	u.i::int, coalesce(to_regclass(u.name)::oid, 0), EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = u.id),
	EXISTS (SELECT 1 FROM pg_publication_tables pt WHERE pt.pubname = $1
		AND to_regclass(format('%I.%I', pt.schemaname, pt.tablename)) = to_regclass(u.name))
	FROM unnest($2::text[], $3::oid[]) WITH ORDINALITY AS u(name, id, i)`

// Check reads the catalogue once and returns ErrUnpublished for the first
// table whose name is now a relation the publication does not publish,
// or whose relation was dropped with nothing of its name in its place (a
// table of a pattern leaves the check instead, decide). It is not safe for
// concurrent use with itself.
func (w *Watch) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := w.db.Get(ctx)
	if err != nil {
		return err
	}
	names, shown, ids, pattern := w.list()
	rows, err := conn.Query(ctx, watchQuery, w.publication, names, ids)
	if err != nil {
		w.db.Close() // a new connection at the next tick
		return fmt.Errorf("reading the publication %q's tables: %w", w.publication, err)
	}
	var reads []watchRead
	for rows.Next() {
		var r watchRead
		if err := rows.Scan(&r.pubExists, &r.i, &r.now, &r.startExists, &r.published); err != nil {
			rows.Close()
			return err
		}
		reads = append(reads, r)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := w.decide(reads, names, shown, ids, pattern); err != nil {
		return err
	}
	if err := w.checkPatterns(ctx, conn); err != nil {
		return err
	}
	return refuseUnlogged(ctx, conn, names, shown)
}

// checkPatterns reads, with a pattern in postgres.tables, the event
// trigger and the tables the patterns match (pg.WatchPatterns), and
// returns ErrUnpublished for the matching tables the publication lacks,
// else ErrTrigger for a trigger no longer as outboxd migrate installed it.
// A table being created by a transaction still open is not visible yet,
// and is not found.
func (w *Watch) checkPatterns(ctx context.Context, conn *pgx.Conn) error {
	unpublished, trigger, err := pg.WatchPatterns(ctx, conn, w.cfg)
	if err != nil {
		w.db.Close() // a new connection at the next tick
		return err
	}
	if len(unpublished) == 0 {
		if trigger == nil {
			return nil
		}
		return &wal.Error{Kind: ErrTrigger, Msg: "while outboxd ran: " + trigger.Error(),
			Remedy: "then start outboxd again: it refuses, by name, a table a pattern matches that was created meanwhile and that the publication lacks"}
	}
	// An UNLOGGED one is not published either, but ADD TABLE of it fails:
	// it needs the remedy of the start-up check (review-fix59 S3).
	unlogged, err := pg.UnloggedMatching(ctx, conn, w.cfg)
	if err != nil {
		w.db.Close() // a new connection at the next tick
		return err
	}
	if len(unlogged) > 0 {
		return &wal.Error{Kind: ErrUnlogged, Msg: "while outboxd ran: " + unlogged[0].Error(), Remedy: "then start outboxd again"}
	}
	names, quoted := make([]string, len(unpublished)), make([]string, len(unpublished))
	for i, m := range unpublished {
		names[i], quoted[i] = m.Name(), pgx.Identifier{m.Schema, m.Table}.Sanitize()
	}
	m := unpublished[0]
	what := fmt.Sprintf("outbox table %s, which postgres.tables[%d] (pattern %s) matches, is", m.Name(), m.Entry, w.cfg.Tables[m.Entry].Name)
	if len(unpublished) > 1 {
		what = fmt.Sprintf("outbox tables %s, which patterns of postgres.tables match, are", strings.Join(names, ", "))
	}
	msg := fmt.Sprintf("%s not published by publication %q, so Postgres puts none of their rows into the slot: "+
		"the event trigger %s did not add them as they were created (it was disabled or dropped, or event_triggers was off), or they were removed from the publication",
		what, w.publication, pg.TriggerName)
	if trigger != nil {
		msg += "; also " + trigger.Error()
	}
	return &wal.Error{Kind: ErrUnpublished, Msg: msg,
		Remedy: fmt.Sprintf("run ALTER PUBLICATION %s ADD TABLE %s and start outboxd again. Its rows written before that statement are not in the slot and are not delivered: "+
			"send them with outboxd replay -table %s -where …, once outboxd runs again", quote.Ident(w.publication), strings.Join(quoted, ", "), names[0])}
}

// ErrUnlogged marks an outbox table, or a partition of one, that is
// UNLOGGED; it is permanent.
var ErrUnlogged error = permanent("an outbox table or a partition of one is UNLOGGED")

// refuseUnlogged returns ErrUnlogged for the first outbox table that is,
// or has a partition at any depth that is, UNLOGGED (pg.RefuseUnlogged,
// one catalogue query): a partition made, attached or changed so while
// outboxd runs, which Postgres allows and the event trigger refuses only
// under a pattern; its rows are in no WAL (review-fix55 Must 1).
func refuseUnlogged(ctx context.Context, conn *pgx.Conn, names, shown []string) error {
	err := pg.RefuseUnlogged(ctx, conn, names, shown)
	var ue *pg.UnloggedPartitionError
	if errors.As(err, &ue) {
		return &wal.Error{Kind: ErrUnlogged, Msg: err.Error()}
	}
	return err
}

// watchRead is what watchQuery read of one table.
type watchRead struct {
	pubExists, startExists, published bool
	i                                 int    // the table's place in the lists, from 1
	now                               uint32 // the relation of its name now, 0: none
}

// decide judges what one check read of the tables in the lists it read
// (list), and returns the first finding. A table of a pattern found
// dropped by this check and the one before leaves the check.
func (w *Watch) decide(reads []watchRead, names, shown []string, ids []uint32, pattern []bool) error {
	var found error
	dropped := map[string]bool{}
	for _, r := range reads {
		k := r.i - 1
		if !r.pubExists || found != nil || k < 0 || k >= len(names) {
			continue
		}
		if pattern[k] && r.now == 0 && (ids[k] == 0 || !r.startExists) {
			dropped[shown[k]] = true
			continue
		}
		found = w.judge(names[k], shown[k], ids[k], r.now, r.startExists, r.published)
	}
	if found == nil {
		for name := range dropped {
			if w.dropped[name] {
				w.forget(name)
			}
		}
	}
	w.dropped = dropped
	return found
}

// judge decides about one table (quoted, its name for messages, and its
// relation ID at the start) from what watchQuery read.
func (w *Watch) judge(quoted, name string, start, now uint32, startExists, published bool) error {
	add := fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", quote.Ident(w.publication), quoted)
	replay := "Its rows written before that statement are not in the slot and are not delivered: send them with outboxd replay -table " + name + " -where …, " +
		"once outboxd runs again. Rename or re-create an outbox table only while outboxd is stopped, and add it to the publication before the application writes it"
	switch {
	case now != 0 && published:
		return nil
	case now != 0:
		return &wal.Error{Kind: ErrUnpublished,
			Msg: fmt.Sprintf("outbox table %s is not published by publication %q (relation %d; %d when the run started): "+
				"it was dropped and created again, another table took its name, or it was removed from the publication, while outboxd ran. "+
				"Postgres puts none of its rows into the slot", name, w.publication, now, start),
			Remedy: "run " + add + " and restart outboxd. " + replay}
	case start != 0 && startExists:
		return nil // renamed: its relation is published and its rows flow
	default:
		return &wal.Error{Kind: ErrUnpublished,
			Msg:    fmt.Sprintf("outbox table %s was dropped while outboxd ran (relation %d no longer exists)", name, start),
			Remedy: "create it again (outboxd migrate), run " + add + ", and restart outboxd. " + replay}
	}
}

// String lists the tables a Watch checks, for a log line.
func (w *Watch) String() string {
	_, shown, _, _ := w.list()
	return strings.Join(shown, ",")
}
