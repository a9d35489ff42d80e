package backfill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
)

// The phases of a backfill (DESIGN.md, "Backfill").
const (
	// phaseSnapshot: recorded before the slot is created, then with the
	// slot's consistent point (LSN) once it is; the rows are not fixed yet,
	// and nothing has streamed from the slot. Deleted when the creation
	// fails.
	phaseSnapshot = "snapshot"
	// phaseSending: the rows are fixed in the key table; Done is the key
	// of the last row Kafka acknowledged with every row before it.
	phaseSending = "sending"
	// phaseDone: every row was sent; the slot may stream.
	phaseDone = "done"
)

// State is a backfill's progress, kept under its slot's name in the state
// table.
type State struct {
	Slot  string   `json:"slot"`
	Table string   `json:"table"`
	Where string   `json:"where"`
	Keys  []string `json:"keys"` // the key columns: the order column, then the primary key's
	Phase string   `json:"phase"`
	// LSN is the slot's consistent point; Snapshot is pg_current_snapshot()
	// read inside the exported snapshot, for the record.
	LSN      string    `json:"lsn,omitempty"`
	Snapshot string    `json:"snapshot,omitempty"`
	Done     []string  `json:"done"`
	Total    int64     `json:"total"` // rows that matched in the snapshot
	Sent     int64     `json:"sent"`  // rows acknowledged
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
}

// execer is a connection or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// store keeps States in the state table, and names the key table of a
// slot. outboxd never writes the outbox table: these two are the only
// tables a backfill writes.
type store struct {
	state  string // the state table, quoted
	keys   string // the key table of the slot, quoted
	name   string // the state table, unquoted, for messages
	schema string // their schema, unquoted
}

// StateTable is the state table's name in the outbox table's schema.
const StateTable = "outboxd_backfill"

func newStore(cfg config.Config) store {
	schema, _ := cfg.Postgres.TableName()
	return storeIn(schema, cfg.Postgres.Slot)
}

// storeIn is the store of slot's backfill with its tables in schema.
func storeIn(schema, slot string) store {
	return store{
		state:  pgx.Identifier{schema, StateTable}.Sanitize(),
		keys:   pgx.Identifier{schema, keyTable(slot)}.Sanitize(),
		name:   schema + "." + StateTable,
		schema: schema,
	}
}

// keyTable is the name of slot's key table: outboxd_backfill_<slot>, with
// the slot's name cut and a hash of it in place of the rest where that is
// longer than Postgres' 63 bytes.
func keyTable(slot string) string {
	name := StateTable + "_" + slot
	if len(name) <= 63 {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(slot))
	return fmt.Sprintf("%s_%08x", name[:63-9], h.Sum32())
}

const stateTableSQL = `CREATE TABLE IF NOT EXISTS %s (slot text PRIMARY KEY, state jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())`

// ensure creates the state table when it is missing.
func (s store) ensure(ctx context.Context, conn *pgx.Conn) error {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.state).Scan(&exists); err != nil {
		return fmt.Errorf("looking up the backfill state table %s: %w", s.name, err)
	}
	if exists {
		return nil
	}
	create := fmt.Sprintf(stateTableSQL, s.state)
	if _, err := conn.Exec(ctx, create); err != nil {
		return fmt.Errorf("creating the backfill state table %s: %w; the role of postgres.dsn needs CREATE on the outbox table's schema "+
			"(it also creates the backfill's key table there): GRANT CREATE ON SCHEMA <schema> TO <role>, or create it (%s) and grant SELECT, INSERT, UPDATE on it",
			s.name, err, create)
	}
	return nil
}

// load reads the slot's state; found is false when there is none.
func (s store) load(ctx context.Context, conn *pgx.Conn, slot string) (st State, found bool, err error) {
	var raw []byte
	err = conn.QueryRow(ctx, `SELECT state::text FROM `+s.state+` WHERE slot = $1`, slot).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return State{}, false, nil
	}
	if err == nil {
		err = json.Unmarshal(raw, &st)
	}
	if err != nil {
		return State{}, false, fmt.Errorf("reading the backfill of slot %q from %s: %w", slot, s.name, err)
	}
	return st, true, nil
}

func (s store) save(ctx context.Context, db execer, st State) error {
	raw, err := json.Marshal(st)
	if err != nil {
		return err
	}
	_, err = db.Exec(ctx, `INSERT INTO `+s.state+` (slot, state, updated_at) VALUES ($1, $2::text::jsonb, now())
		ON CONFLICT (slot) DO UPDATE SET state = EXCLUDED.state, updated_at = now()`, st.Slot, string(raw))
	if err != nil {
		return fmt.Errorf("saving the progress of the backfill of slot %q in %s: %w", st.Slot, s.name, err)
	}
	return nil
}

// forget deletes the state of a backfill whose slot was not made (or was
// dropped again), and returns cause. A failure to delete is logged: the
// next start finds the row and, without the slot it records, makes both
// again.
func (s store) forget(ctx context.Context, conn *pgx.Conn, slot string, cause error, log *slog.Logger) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(dctx, `DELETE FROM `+s.state+` WHERE slot = $1 AND state->>'phase' = $2`, slot, phaseSnapshot); err != nil {
		log.Warn("could not delete the state of a backfill whose slot was not made", "slot", slot, "table", s.name, "err", err)
	}
	return cause
}

// lock takes the session advisory lock of slot's backfill on conn, waiting
// while another process holds it; unlock releases it (closing conn does
// too).
func lock(ctx context.Context, conn *pgx.Conn, slot string) (unlock func(), err error) {
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext('outboxd.backfill:' || $1))`, slot); err != nil {
		return nil, fmt.Errorf("locking the backfill of slot %q: %w", slot, err)
	}
	return func() {
		_, _ = conn.Exec(context.Background(), `SELECT pg_advisory_unlock(hashtext('outboxd.backfill:' || $1))`, slot)
	}, nil
}
