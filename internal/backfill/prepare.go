package backfill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/replay"
	"github.com/outboxd/outboxd/wal"
)

// snapshotName is the form of an exported snapshot's name
// (00000003-0000001B-1), checked before it is put into SQL.
var snapshotName = regexp.MustCompile(`^[0-9A-Fa-f-]+$`)

// Prepare makes the slot of a configured backfill, or checks the one there
// (the package's duty 1). conn is a normal connection, openRepl opens a
// replication connection. It returns with the slot existing and the
// backfill recorded, or an error.
func Prepare(ctx context.Context, conn *pgx.Conn, openRepl func(context.Context) (*pgconn.PgConn, error), cfg config.Config, log *slog.Logger) error {
	pc := cfg.Postgres
	// Two processes starting on one slot (a standby beside its primary)
	// prepare one after the other: neither drops a slot the other is
	// fixing the rows of.
	unlock, err := lock(ctx, conn, pc.Slot)
	if err != nil {
		return err
	}
	defer unlock()
	s := newStore(cfg)
	if err := s.ensure(ctx, conn); err != nil {
		return err
	}
	st, found, err := s.load(ctx, conn, pc.Slot)
	if err != nil {
		return err
	}
	info, exists, err := wal.InspectSlot(ctx, conn, pc.Slot)
	if err != nil {
		return err
	}
	switch {
	case found && st.Phase != phaseSnapshot && exists:
		if strings.TrimSpace(st.Where) != strings.TrimSpace(pc.Backfill.Where) && st.Phase != phaseDone {
			log.Warn("postgres.backfill.where differs from the condition the backfill under way was started with; it goes on with the rows it fixed then",
				"slot", pc.Slot, "where", st.Where)
		}
		return nil
	case found && st.Phase == phaseDone:
		return fmt.Errorf("replication slot %q no longer exists, and postgres.backfill is set: its backfill is done (%s), and creating a new slot with a new backfill would send its rows again. "+
			"Remove postgres.backfill to create the slot without one (events committed while there was no slot are not delivered: send them with outboxd replay), "+
			"or, to backfill anew, DELETE FROM %s WHERE slot = '%s' and start outboxd", pc.Slot, s.name, s.state, pc.Slot)
	case found && st.Phase != phaseSnapshot:
		return fmt.Errorf("replication slot %q, which the backfill recorded in %s was made for, no longer exists; the backfill's rows and the events committed since are no longer told apart. "+
			"To start again: DELETE FROM %s WHERE slot = '%s'; DROP TABLE IF EXISTS %s; then start outboxd, which creates the slot and backfills anew",
			pc.Slot, s.name, s.state, pc.Slot, s.keys)
	case !found && exists:
		db, err := currentDatabase(ctx, conn)
		if err != nil {
			return err
		}
		if info.Database != db {
			return otherDatabaseSlot(pc.Slot, info.Database, s)
		}
		return fmt.Errorf("postgres.backfill is set, but replication slot %q exists and was not made by a backfill: events it already delivered cannot be told apart from the rows the backfill would send. "+
			"Remove postgres.backfill (and send rows with outboxd replay), or stop outboxd, drop the slot (SELECT pg_drop_replication_slot('%s')) and start it again to create the slot with the backfill",
			pc.Slot, pc.Slot)
	case exists: // phase snapshot: a kill came before the rows were recorded fixed
		if info.Active {
			return &wal.SlotActiveError{Slot: pc.Slot, PID: info.ActivePID}
		}
		db, err := currentDatabase(ctx, conn)
		if err != nil {
			return err
		}
		// Drop it only if it is the slot the backfill recorded making: of
		// this database, and still at the consistent point recorded when it
		// was made, so nothing was confirmed from it (review H2).
		made, lsnErr := wal.ParseLSN(st.LSN)
		switch {
		case info.Database != db:
			return otherDatabaseSlot(pc.Slot, info.Database, s)
		case lsnErr != nil:
			// Killed between making the slot and recording where, or a
			// state row of an older outboxd: nothing can have been sent.
			return fmt.Errorf("replication slot %q exists, and the backfill recorded in %s was stopped before it recorded the slot it made, so outboxd cannot tell that it made it. "+
				"If no other process uses the slot, drop it (SELECT pg_drop_replication_slot('%s')) and start again; otherwise name another slot (postgres.slot), DELETE FROM %s WHERE slot = '%s' and DROP TABLE IF EXISTS %s",
				pc.Slot, s.name, pc.Slot, s.state, pc.Slot, s.keys)
		case info.ConfirmedFlushLSN != made:
			// Something streamed from it and confirmed: dropping it would
			// lose what that consumer has not seen and send again what it
			// has (review-bf36 R1).
			return fmt.Errorf("replication slot %q was confirmed to %s after the backfill recorded in %s made it at %s: another process streamed from it. Do not drop it. "+
				"To keep streaming from it without the backfill: remove postgres.backfill, DELETE FROM %s WHERE slot = '%s'; DROP TABLE IF EXISTS %s; "+
				"and send rows still pending from before the slot with outboxd replay",
				pc.Slot, info.ConfirmedFlushLSN, s.name, st.LSN, s.state, pc.Slot, s.keys)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, pc.Slot); err != nil {
			return fmt.Errorf("dropping replication slot %q, created by a backfill that stopped before it fixed its rows: %w", pc.Slot, err)
		}
		log.Info("dropped the replication slot a backfill created before it stopped without fixing its rows; creating it again", "slot", pc.Slot)
	}
	return create(ctx, conn, openRepl, cfg, s, log)
}

// create records the backfill, creates the slot with its snapshot exported
// and fixes the rows in the key table inside that snapshot.
func create(ctx context.Context, conn *pgx.Conn, openRepl func(context.Context) (*pgconn.PgConn, error), cfg config.Config, s store, log *slog.Logger) (err error) {
	pc := cfg.Postgres
	if err := replay.CheckWhere(pc.Backfill.Where); err != nil {
		// The checks are replay's, whose flag the message names.
		return errors.New(strings.Replace(err.Error(), "-where", "postgres.backfill.where", 1))
	}
	src, err := replay.OpenSource(ctx, conn, cfg, pc.Backfill.OrderBy)
	if err != nil {
		return fmt.Errorf("postgres.backfill.order_by %q: %w", pc.Backfill.OrderBy, err)
	}
	if typ := unorderedDefault(src, pc.Backfill.OrderBy); typ != "" {
		log.Warn("postgres.backfill.order_by is not set and the table has no created_at column, so the rows are sent in the order of its primary key, of type "+typ+
			", whose values need not follow the order the rows were written in: each key's events may go out of their order. "+
			"Set postgres.backfill.order_by to a column that increases with insertion (a timestamp, a sequence) before a backfill starts: one under way keeps the order it started with",
			"slot", pc.Slot, "table", src.Name, "order", src.Keys[0])
	}
	schema, table := pc.TableName()
	from := pgx.Identifier{schema, table}.Sanitize()
	// Planned, not run, before the slot is made: a condition Postgres
	// refuses leaves no slot behind.
	if _, err := conn.Exec(ctx, "EXPLAIN SELECT 1 FROM "+from+" WHERE (\n"+pc.Backfill.Where+"\n)"); err != nil {
		return fmt.Errorf("postgres.backfill.where %q is refused by Postgres: %w; fix the condition: it is the body of a WHERE over the columns of %s",
			pc.Backfill.Where, err, src.Name)
	}
	// Saved before the slot is made, so that a kill after CREATE_REPLICATION_SLOT
	// finds it; the slot's consistent point is added as soon as it is known.
	st := State{Slot: pc.Slot, Table: src.Name, Where: pc.Backfill.Where, Keys: src.Keys, Phase: phaseSnapshot, Started: time.Now().UTC()}
	// The key table is made, empty, before the state is recorded, and is
	// there until the transaction that records the backfill done drops it
	// (the snapshot's transaction replaces it with the rows): a process
	// without postgres.backfill that may not read the state table sees in
	// pg_class that a backfill of this slot is unfinished, in every phase
	// (RefuseUnfinished, review-fix55 Should 3).
	for _, q := range []string{"DROP TABLE IF EXISTS " + s.keys, "CREATE TABLE " + s.keys + " ()"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("creating the backfill's key table %s: %w; the role of postgres.dsn needs CREATE on the outbox table's schema", s.keys, err)
		}
	}
	if err := s.save(ctx, conn, st); err != nil {
		return abandon(ctx, conn, s, pc.Slot, err, log)
	}
	repl, err := openRepl(ctx)
	if err != nil {
		return abandon(ctx, conn, s, pc.Slot, err, log)
	}
	defer repl.Close(context.WithoutCancel(ctx))
	exp, err := wal.CreateSlotExporting(ctx, repl, pc.Slot)
	if err != nil {
		// No slot was made: a row saying one was would let a later start
		// take a slot of that name, made by someone else, for the
		// backfill's (review H2).
		return abandon(ctx, conn, s, pc.Slot, err, log)
	}
	fixed := false // the key table is committed
	defer func() {
		if err != nil && !fixed { // the rows were not fixed: no slot is left without them
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			repl.Close(dctx) // releases the snapshot and the slot
			if _, derr := conn.Exec(dctx, `SELECT pg_drop_replication_slot($1)`, pc.Slot); derr != nil {
				log.Warn("could not drop the replication slot the backfill made before it failed; the next start drops it", "slot", pc.Slot, "err", derr)
				return
			}
			_ = abandon(dctx, conn, s, pc.Slot, nil, log)
		}
	}()
	// Which slot the backfill made: a start after a kill drops a slot of
	// this name only while it is still at this point. The exported snapshot
	// stays valid: the replication connection runs nothing else.
	st.LSN = exp.LSN.String()
	if err := s.save(ctx, conn, st); err != nil {
		return err
	}
	if !snapshotName.MatchString(exp.Snapshot) {
		return fmt.Errorf("creating replication slot %q: the server exported a snapshot named %q, not a snapshot name", pc.Slot, exp.Snapshot)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return fmt.Errorf("opening the backfill's snapshot: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit, a no-op
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+exp.Snapshot+"'"); err != nil {
		return fmt.Errorf("importing the snapshot of replication slot %q: %w", pc.Slot, err)
	}
	// The replication connection may now be closed: the transaction holds
	// the snapshot.
	keys := quoted(src.Keys)
	if _, err := tx.Exec(ctx, "DROP TABLE IF EXISTS "+s.keys); err != nil {
		return fmt.Errorf("dropping the backfill's old key table %s: %w", s.keys, err)
	}
	// The rows themselves, not only their keys: a row the application
	// deletes or updates after the snapshot is still the event it was, as
	// the WAL keeps a streamed row. The keys are among the columns.
	cols := make([]string, len(src.Relation.Columns))
	for i, c := range src.Relation.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	if _, err := tx.Exec(ctx, "CREATE TABLE "+s.keys+" AS SELECT "+strings.Join(cols, ", ")+" FROM "+from+
		" WHERE (\n"+pc.Backfill.Where+"\n)"); err != nil {
		return fmt.Errorf("postgres.backfill.where %q: fixing the rows to backfill in %s failed: %w; fix the condition (the body of a WHERE over %s's columns), "+
			"or grant the role of postgres.dsn CREATE on the schema", pc.Backfill.Where, s.keys, err, src.Name)
	}
	var nulls int64
	if err := tx.QueryRow(ctx, "SELECT pg_current_snapshot()::text, count(*), count(*) FILTER (WHERE "+keys[0]+" IS NULL) FROM "+s.keys).
		Scan(&st.Snapshot, &st.Total, &nulls); err != nil {
		return fmt.Errorf("counting the rows to backfill: %w", err)
	}
	if nulls > 0 {
		return fmt.Errorf("postgres.backfill.order_by %s: %d of the %d rows to backfill have no value (NULL) in it; order by another column, or add %q to the condition",
			src.Keys[0], nulls, st.Total, "AND "+src.Keys[0]+" IS NOT NULL")
	}
	if _, err := tx.Exec(ctx, "ALTER TABLE "+s.keys+" ADD PRIMARY KEY ("+strings.Join(keys, ", ")+")"); err != nil {
		return fmt.Errorf("indexing the backfill's key table %s: %w", s.keys, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("fixing the rows to backfill: %w", err)
	}
	fixed = true
	// Saved after the commit, not in the snapshot's transaction, which
	// cannot update the row saved since the snapshot (SQLSTATE 40001). A
	// kill in between leaves phase snapshot: the next start drops the slot,
	// nothing having streamed from it, and fixes the rows again. A failed
	// save keeps the slot: the server may have applied it (the reply lost),
	// and the next start then resumes phase sending on that slot, which a
	// drop would have turned into a refusal (review-bf36 R3).
	st.Phase = phaseSending
	if err := s.save(ctx, conn, st); err != nil {
		return err
	}
	log.Info("created replication slot with the backfill's snapshot; the rows before it are sent first", "slot", pc.Slot, "lsn", exp.LSN.String(),
		"table", src.Name, "where", st.Where, "order", st.Keys, "rows", st.Total, "snapshot", st.Snapshot)
	return nil
}

// unorderedDefault names the type of the default order column (order_by
// unset: created_at, else the primary key) when it is the primary key and a
// uuid or a text, whose values need not increase with insertion, and is ""
// otherwise (review-bf36 R5).
func unorderedDefault(src replay.Source, orderBy string) string {
	if orderBy != "" || len(src.Keys) == 0 || len(src.Primary) == 0 || src.Keys[0] != src.Primary[0] {
		return ""
	}
	for _, c := range src.Relation.Columns {
		if c.Name != src.Keys[0] {
			continue
		}
		switch c.TypeOID {
		case pgtype.UUIDOID:
			return "uuid"
		case pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID:
			return "text"
		}
	}
	return ""
}

// abandon clears, best effort, what a creation that failed before its rows
// were fixed leaves of its backfill, and returns cause: the key table, the
// empty one this attempt made or one an earlier attempt committed (left,
// it would hold a copy of the rows that nothing points at, and tell
// RefuseUnfinished that a backfill is unfinished), then the state
// (store.forget). The slot, if one was made, is dropped before (review-bf36
// R4). The state is this attempt's, in phase snapshot, under the lock: no
// backfill sends from that key table.
func abandon(ctx context.Context, conn *pgx.Conn, s store, slot string, cause error, log *slog.Logger) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(dctx, "DROP TABLE IF EXISTS "+s.keys); err != nil {
		log.Warn("could not drop the backfill's key table after it failed; drop it by hand", "slot", slot, "table", s.keys, "err", err)
	}
	return s.forget(dctx, conn, slot, cause, log)
}

func quoted(cols []string) []string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = pgx.Identifier{c}.Sanitize()
	}
	return out
}

// RefuseUnfinished is the start-up check of a slot without postgres.backfill:
// a backfill recorded for the slot that is not done would have its
// remaining rows passed over, as streaming confirms the slot past them, or
// sent after newer events of their keys. Call it after the slot was
// inspected: the state is committed before the slot is made, so a slot
// the inspection saw has its backfill's state here (review-bf36 R2).
// It reads every state table of the database, in whichever schema: a
// backfill keeps its state in its one outbox table's schema, which this
// process's configuration need not name (several tables or a pattern:
// review-eosbf R2b). Temporary tables (another session's pg_temp) are not
// state tables; a table of the name without outboxd's columns is refused,
// for outboxd reserves the name. A state table it may not read (another
// deployment's, in a database two share) refuses the start only when the
// slot's key table is in the same schema (visible in pg_class to every
// role): a backfill of this slot makes it before it records its state,
// and drops it in the transaction that records it done, so it is there
// in every unfinished phase; otherwise the start goes on with a warning
// (review-eosbf S1, review-fix55 Should 3, 4).
func RefuseUnfinished(ctx context.Context, conn *pgx.Conn, cfg config.Config, log *slog.Logger) error {
	slot := cfg.Postgres.Slot
	rows, err := conn.Query(ctx, `SELECT n.nspname::text,
			EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'slot' AND NOT a.attisdropped)
				AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'state' AND NOT a.attisdropped),
			EXISTS (SELECT 1 FROM pg_class k WHERE k.relnamespace = c.relnamespace AND k.relname = $2)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = $1 AND c.relkind IN ('r', 'p') AND c.relpersistence <> 't' ORDER BY 1`, StateTable, keyTable(slot))
	if err != nil {
		return fmt.Errorf("looking for backfill state tables (%s): %w", StateTable, err)
	}
	type found struct {
		schema        string
		ours, hasKeys bool
	}
	var tables []found
	var f found
	if _, err := pgx.ForEachRow(rows, []any{&f.schema, &f.ours, &f.hasKeys}, func() error {
		tables = append(tables, f)
		return nil
	}); err != nil {
		return fmt.Errorf("looking for backfill state tables (%s): %w", StateTable, err)
	}
	for _, f := range tables {
		s := storeIn(f.schema, slot)
		if !f.ours {
			return fmt.Errorf("table %s is not a backfill state table of outboxd (it lacks the columns slot and state), but outboxd reserves the name %s in every schema: "+
				"without postgres.backfill it reads every table of that name, for a backfill of slot %q may keep its state in any schema. Rename it (ALTER TABLE %s RENAME TO …)",
				s.name, StateTable, slot, s.state)
		}
		if err := s.refuseUnfinished(ctx, conn, slot, f.hasKeys, log); err != nil {
			return err
		}
	}
	return nil
}

// refuseUnfinished refuses slot's backfill recorded in s that is not done.
// hasKeys tells whether the slot's key table is in s's schema: a state
// table the role may not read is refused only then.
func (s store) refuseUnfinished(ctx context.Context, conn *pgx.Conn, slot string, hasKeys bool, log *slog.Logger) error {
	st, found, err := s.load(ctx, conn, slot)
	if err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			return err
		}
		if !hasKeys {
			log.Warn("outboxd may not read a backfill state table, and no backfill of this slot is unfinished there (its key table "+keyTable(slot)+" is not in that schema): going on",
				"slot", slot, "table", s.name, "err", err)
			return nil
		}
		return s.unreadable(slot, err)
	}
	if !found || st.Phase == phaseDone {
		return nil
	}
	if st.Phase == phaseSnapshot {
		return fmt.Errorf("postgres.backfill is not set, but a backfill of slot %q recorded in %s has not fixed its rows yet (phase snapshot): "+
			"a process with postgres.backfill is making the slot now, or was stopped while it did. Streaming the slot would send its events before the older rows the backfill sends. "+
			"Start outboxd with postgres.backfill as that process has it, to finish the backfill; or, to give it up, stop that process, "+
			"then DELETE FROM %s WHERE slot = '%s'; DROP TABLE IF EXISTS %s (the rows it may have copied)",
			slot, s.name, s.state, slot, s.keys)
	}
	return fmt.Errorf("postgres.backfill is not set, but the backfill of slot %q recorded in %s is not done (phase %s, %d of %d rows sent): "+
		"streaming the slot now would confirm it past the rows not sent, and they would never be. Set postgres.backfill back as it was to finish it "+
		"(it resumes after the last page Kafka acknowledged), then remove it; or, to give those rows up, DELETE FROM %s WHERE slot = '%s'; DROP TABLE IF EXISTS %s",
		slot, s.name, st.Phase, st.Sent, st.Total, s.state, slot, s.keys)
}

// unreadable refuses a start because the role may not read s, beside the
// key table of slot (err).
func (s store) unreadable(slot string, err error) error {
	return fmt.Errorf("postgres.backfill is not set, and outboxd must check that no backfill of slot %q is unfinished before it streams the slot, but it may not read the backfill state table %s: %w; "+
		"the slot's key table %s is there, as it is while a backfill of the slot is not done, whose rows would be sent after newer events of their keys, or never. "+
		"Let the role of postgres.dsn read it: GRANT USAGE ON SCHEMA %s TO <role>; GRANT SELECT ON %s TO <role>",
		slot, s.name, err, s.keys, pgx.Identifier{s.schema}.Sanitize(), s.state)
}

func currentDatabase(ctx context.Context, conn *pgx.Conn) (string, error) {
	var db string
	err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&db)
	return db, err
}

// otherDatabaseSlot refuses a slot of the backfill's name that belongs to
// another database: it is that database's, never outboxd's to drop.
func otherDatabaseSlot(slot, db string, s store) error {
	return fmt.Errorf("replication slot %q belongs to database %q, not this one: it is not this backfill's and outboxd leaves it alone. "+
		"Name another slot (postgres.slot) and DELETE FROM %s WHERE slot = '%s'", slot, db, s.state, slot)
}
