package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// State is a run's progress, kept under its run id in the state table
// (-state-table): enough to resume it after a kill with the same rows, in
// the same order, from the first row Kafka had not acknowledged.
type State struct {
	Run     string   `json:"run"`
	Table   string   `json:"table"`
	Where   string   `json:"where"`
	Keys    []string `json:"keys"` // the key columns: the order column, then the primary key's
	ToTopic string   `json:"to_topic,omitempty"`
	// End is the key of the last row that matched when the run started:
	// rows committed since with a key past it are not the run's. Nil when
	// no row matched.
	End []string `json:"end"`
	// Done is the key of the last row Kafka acknowledged, with every row
	// before it; nil before the first.
	Done     []string  `json:"done"`
	Total    int64     `json:"total"` // rows that matched when the run started
	Sent     int64     `json:"sent"`  // rows acknowledged
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
}

// store keeps States in a table of their own. outboxd never writes the
// outbox table: the state table is the only one a replay writes.
type store struct {
	conn  *pgx.Conn
	name  string // as given
	ident string // quoted
}

// stateTableSQL creates the state table; %s is its quoted name.
const stateTableSQL = `CREATE TABLE IF NOT EXISTS %s (run_id text PRIMARY KEY, state jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())`

// ensure creates the state table when it is missing, and checks that the
// role may read and write it.
func (s store) ensure(ctx context.Context) error {
	var exists bool
	if err := s.conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.ident).Scan(&exists); err != nil {
		return fmt.Errorf("looking up the replay state table %s: %w", s.name, err)
	}
	create := fmt.Sprintf(stateTableSQL, s.ident)
	if !exists {
		if _, err := s.conn.Exec(ctx, create); err != nil {
			return fmt.Errorf("creating the replay state table %s: %w; create it as a role that may (%s), grant SELECT, INSERT, UPDATE on it "+
				"to the role of postgres.dsn, or name another with -state-table", s.name, err, create)
		}
	}
	var ok bool
	if err := s.conn.QueryRow(ctx, `SELECT has_table_privilege($1, 'SELECT, INSERT, UPDATE')`, s.ident).Scan(&ok); err != nil {
		return fmt.Errorf("reading the role's privileges on the replay state table %s: %w", s.name, err)
	}
	if !ok {
		return fmt.Errorf("the role of postgres.dsn may not read and write the replay state table %s; run GRANT SELECT, INSERT, UPDATE ON %s TO <role>, "+
			"or name another with -state-table", s.name, s.ident)
	}
	return nil
}

// errNoRun: the state table has no run of the id given to -resume.
var errNoRun = errors.New("no such replay run")

func (s store) load(ctx context.Context, run string) (State, error) {
	var raw []byte
	err := s.conn.QueryRow(ctx, `SELECT state::text FROM `+s.ident+` WHERE run_id = $1`, run).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return State{}, fmt.Errorf("-resume %s: %w in %s; give the run id a replay printed when it started (the runs: SELECT run_id, state FROM %s)",
			run, errNoRun, s.name, s.ident)
	}
	if err != nil {
		return State{}, fmt.Errorf("reading replay run %s from %s: %w", run, s.name, err)
	}
	var st State
	if err := json.Unmarshal(raw, &st); err != nil {
		return State{}, fmt.Errorf("reading replay run %s from %s: %w", run, s.name, err)
	}
	return st, nil
}

func (s store) save(ctx context.Context, st State) error {
	raw, err := json.Marshal(st)
	if err != nil {
		return err
	}
	_, err = s.conn.Exec(ctx, `INSERT INTO `+s.ident+` (run_id, state, updated_at) VALUES ($1, $2::text::jsonb, now())
		ON CONFLICT (run_id) DO UPDATE SET state = EXCLUDED.state, updated_at = now()`, st.Run, string(raw))
	if err != nil {
		return fmt.Errorf("saving the progress of replay run %s in %s: %w", st.Run, s.name, err)
	}
	return nil
}

// lock takes a session advisory lock on run, so that two processes never
// run it at once; it is released when the connection closes.
func (s store) lock(ctx context.Context, run string) error {
	var ok bool
	if err := s.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext('outboxd.replay:' || $1))`, run).Scan(&ok); err != nil {
		return fmt.Errorf("locking replay run %s: %w", run, err)
	}
	if !ok {
		return fmt.Errorf("replay run %s is running in another process; wait for it to end or stop it first", run)
	}
	return nil
}
