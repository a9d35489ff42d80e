package replay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// Header is the header every replayed record carries, beside the usual
// ones; its value is the run's id.
const Header = "outboxd.replay"

// Defaults of Options.
const (
	DefaultRate       = 1000 // records per second
	DefaultBatch      = 500  // rows per page
	DefaultStateTable = "outboxd_replay"
	DefaultProgress   = 10 * time.Second
)

// Options is what the operator asks of a replay (outboxd replay's flags).
type Options struct {
	// Table is the outbox table, schema-qualified; "" is postgres.table.
	Table string
	// Where is the condition the rows to send match: the body of a WHERE.
	Where string
	// ToTopic, when set, is the topic of every record instead of the
	// routed one.
	ToTopic string
	// Rate caps the records sent per second; 0 is no cap.
	Rate float64
	// Order is the column whose order each key's records keep; "" is
	// created_at when the table has it, else the primary key.
	Order string
	// Batch is the number of rows read, sent and acknowledged at a time: a
	// resumed run sends again at most that many.
	Batch int
	// Resume is the id of a run to resume; Where, Order and ToTopic are
	// then the run's.
	Resume string
	// StateTable is where runs keep their progress; "" is outboxd_replay
	// in the outbox table's schema.
	StateTable string
	// Progress is the time between two progress lines in the log.
	Progress time.Duration
}

// check checks the options that need no server.
func (o Options) check() error {
	if o.Resume == "" || o.Where != "" {
		if err := CheckWhere(o.Where); err != nil {
			return err
		}
	}
	switch {
	case o.Rate < 0:
		return fmt.Errorf("-rate %g: the rate is in records per second, 0 for no limit", o.Rate)
	case o.Batch < 1 || o.Batch > 100000:
		return fmt.Errorf("-batch %d: give between 1 and 100000 rows", o.Batch)
	case o.ToTopic != "" && !validTopic(o.ToTopic):
		return fmt.Errorf("-to-topic %q is not a Kafka topic name: 1-249 letters, digits, '.', '_' or '-'", o.ToTopic)
	case o.Progress <= 0:
		return fmt.Errorf("-progress %s: give a positive interval", o.Progress)
	}
	return nil
}

func validTopic(t string) bool {
	return len(t) <= 249 && t != "." && t != ".." &&
		strings.Trim(t, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == ""
}

// qualified returns a table name with its schema ("public" when it has none).
func qualified(name string) string {
	schema, table := config.Postgres{Table: name}.TableName()
	return schema + "." + table
}

// tableConfig returns the configuration of the table of postgres.tables
// that -table names (config.Config.PerTable), or that a pattern of
// postgres.tables matches (config.Postgres.EntryOf, as outboxd picks the
// entry): a replay routes its rows as outboxd routes that table's.
func tableConfig(cfg config.Config, table string) (config.Config, error) {
	per, err := cfg.PerTable()
	if err != nil {
		return cfg, err
	}
	names := make([]string, len(per))
	for i, c := range per {
		if table != "" && qualified(c.Postgres.Table) == qualified(table) {
			return c, nil
		}
		names[i] = c.Postgres.Table
	}
	if table != "" {
		schema, name, _ := strings.Cut(qualified(table), ".")
		if i, ok := cfg.Postgres.EntryOf(schema, name); ok && cfg.Postgres.Tables[i].Pattern() {
			per, err := cfg.PerTableOf([]string{schema + "." + name}, []int{i})
			if err != nil {
				return cfg, err
			}
			return per[0], nil
		}
	}
	for _, e := range cfg.Postgres.Tables {
		if e.Pattern() {
			names = append(names, e.Name)
		}
	}
	if table == "" {
		return cfg, fmt.Errorf("postgres.tables lists several tables (%s): name the one to replay with -table (also with -resume)", strings.Join(names, ", "))
	}
	return cfg, fmt.Errorf("-table %s: it is none of postgres.tables (%s), and a replay routes rows as outboxd does; give the configuration of the outboxd that delivers %s",
		table, strings.Join(names, ", "), table)
}

// Replay is a run that Open checked and recorded; Run sends its rows.
type Replay struct {
	cfg      config.Config
	log      *slog.Logger
	conn     *pgx.Conn
	store    store
	state    State
	resumed  bool
	reads    reads
	rel      *wal.Relation
	router   *router.Router
	producer *sink.Producer
	pace     pacer
	batch    int
	progress time.Duration
	header   router.Header
}

// Open checks a replay against the configuration, the table and the
// operator's clause, records a new run (or reads the run to resume) in the
// state table, and connects to Kafka. Close releases what it opened.
func Open(ctx context.Context, cfg config.Config, opts Options, log *slog.Logger) (_ *Replay, err error) {
	if opts.Batch == 0 {
		opts.Batch = DefaultBatch
	}
	if opts.Progress == 0 {
		opts.Progress = DefaultProgress
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	if cfg.Postgres.Several() {
		if cfg, err = tableConfig(cfg, opts.Table); err != nil {
			return nil, err
		}
	}
	if opts.Table != "" && qualified(opts.Table) != qualified(cfg.Postgres.Table) {
		return nil, fmt.Errorf("-table %s: outboxd delivers %s (postgres.table), and a replay routes rows as outboxd does; "+
			"give the configuration of the outboxd that delivers %s", opts.Table, cfg.Postgres.Table, opts.Table)
	}
	schema, name := cfg.Postgres.TableName()
	if opts.StateTable == "" {
		opts.StateTable = schema + "." + DefaultStateTable
	}
	conn, err := pg.Connect(ctx, cfg.Postgres)
	if err != nil {
		return nil, err
	}
	r := &Replay{cfg: cfg, log: log, conn: conn, pace: newPacer(opts.Rate), batch: opts.Batch, progress: opts.Progress}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	sschema, sname := config.Postgres{Table: opts.StateTable}.TableName()
	r.store = store{conn: conn, name: opts.StateTable, ident: pgx.Identifier{sschema, sname}.Sanitize()}
	if opts.Resume != "" {
		if r.state, err = r.resume(ctx, opts); err != nil {
			return nil, err
		}
	}
	t, err := readTable(ctx, conn, schema, name, cfg.Router.KeyColumn)
	if err != nil {
		return nil, err
	}
	if r.router, err = newRouter(cfg.Router, t); err != nil {
		return nil, err
	}
	r.rel = t.rel
	keys := r.state.Keys
	if opts.Resume == "" {
		if keys, err = t.keyColumns(opts.Order); err != nil {
			return nil, err
		}
	} else if missing := pg.MissingColumns(columns(t.rel), keys); len(missing) > 0 {
		return nil, fmt.Errorf("-resume %s: table %s no longer has column %s, which the run is ordered by; start a new run", opts.Resume, t.name, strings.Join(missing, ", "))
	}
	where := opts.Where
	if opts.Resume != "" {
		where = r.state.Where
	}
	r.reads = newReads(schema, name, columns(t.rel), keys, where)
	if opts.Resume == "" {
		if r.state, err = r.begin(ctx, t, keys, opts); err != nil {
			return nil, err
		}
		if err := r.store.ensure(ctx); err != nil {
			return nil, err
		}
		if err := r.store.lock(ctx, r.state.Run); err != nil {
			return nil, err
		}
		if err := r.store.save(ctx, r.state); err != nil {
			return nil, err
		}
	}
	r.header = router.Header{Key: Header, Value: []byte(r.state.Run)}
	if r.producer, err = sink.New(cfg.Kafka, sink.NewMetrics(prometheus.NewRegistry()), log); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := r.producer.Warm(wctx); err != nil {
		return nil, err
	}
	return r, nil
}

// resume reads the run to resume and checks that the options given agree
// with it.
func (r *Replay) resume(ctx context.Context, opts Options) (State, error) {
	if err := r.store.ensure(ctx); err != nil {
		return State{}, err
	}
	// Locked before it is read: a process that held it until now may have
	// moved it on.
	if err := r.store.lock(ctx, opts.Resume); err != nil {
		return State{}, err
	}
	st, err := r.store.load(ctx, opts.Resume)
	if err != nil {
		return State{}, err
	}
	differs := func(flag, given, run string) error {
		if given == "" || given == run {
			return nil
		}
		return fmt.Errorf("-resume %s: the run has %s %q, not %q; leave %s out to resume it as it started, or start a new run", st.Run, flag, run, given, flag)
	}
	if err := errors.Join(differs("-where", opts.Where, st.Where), differs("-to-topic", opts.ToTopic, st.ToTopic),
		differs("-order", opts.Order, firstOf(st.Keys))); err != nil {
		return State{}, err
	}
	if qualified(st.Table) != qualified(r.cfg.Postgres.Table) {
		return State{}, fmt.Errorf("-resume %s: the run replays %s, but this configuration's postgres.table is %s", st.Run, st.Table, r.cfg.Postgres.Table)
	}
	if !st.Finished.IsZero() {
		return State{}, fmt.Errorf("-resume %s: the run finished at %s, having sent %d rows; start a new run to send them again",
			st.Run, st.Finished.Format(time.RFC3339), st.Sent)
	}
	r.resumed = true
	return st, nil
}

func firstOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

func columns(rel *wal.Relation) []string {
	cols := make([]string, len(rel.Columns))
	for i, c := range rel.Columns {
		cols[i] = c.Name
	}
	return cols
}

// begin checks the operator's clause on the server, in a READ ONLY
// transaction, and reads the new run's bounds there: how many rows match
// and the key of the last one, which ends the run.
func (r *Replay) begin(ctx context.Context, t table, keys []string, opts Options) (State, error) {
	st := State{Run: newRunID(), Table: t.name, Where: opts.Where, Keys: keys, ToTopic: opts.ToTopic, Started: time.Now().UTC()}
	order := keys[0]
	tx, err := r.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return st, fmt.Errorf("checking -where on %s: %w", t.name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read only
	var nulls int64
	bounds, at := r.reads.bounds()
	if err := tx.QueryRow(ctx, bounds).Scan(&st.Total, &nulls); err != nil {
		return st, whereError(err, opts.Where, at, t)
	}
	if nulls > 0 {
		return st, fmt.Errorf("-order %s: %d of the %d rows matching -where have no value (NULL) in it, and a replay keeps to its order; "+
			"order by another column with -order, or leave them out with -where \"(...) AND %s IS NOT NULL\"", order, nulls, st.Total, order)
	}
	rows, err := tx.Query(ctx, r.reads.last(), pgx.QueryResultFormats{pgx.TextFormatCode})
	if err != nil {
		return st, fmt.Errorf("-order %s: reading the last matching row of %s in its order: %w", order, t.name, err)
	}
	for rows.Next() {
		for _, v := range rows.RawValues() {
			st.End = append(st.End, string(v))
		}
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("-order %s: reading the last matching row of %s in its order: %w", order, t.name, err)
	}
	if !t.leading[order] && st.Total > 10*int64(r.batch) {
		r.log.Warn("no index of "+t.name+" starts with "+order+": each page of the replay reads every matching row to sort them; "+
			"an index on ("+strings.Join(keys, ", ")+") makes each page read only its rows", "table", t.name)
	}
	if t.sharedDefault(order) && opts.Order == "" {
		r.log.Warn("the rows of one transaction share their "+order+" (its default is "+t.defaults[order]+"), so the primary key orders them, "+
			"which may not be the order they were inserted in: for each key's order within a transaction, name a column that grows with every row "+
			"with -order (an identity column, or a timestamp defaulting to clock_timestamp())", "table", t.name)
	}
	return st, nil
}

// whereError explains a server's refusal of the operator's clause, which
// starts at character at of the statement.
func whereError(err error, clause string, at int, t table) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("checking -where on %s: %w", t.name, err)
	}
	place := ""
	if p := int(pgErr.Position) - at; pgErr.Position > 0 && p >= 0 && p <= len([]rune(clause)) {
		place = fmt.Sprintf(" at character %d of it", p+1)
	}
	hint := ""
	if pgErr.Hint != "" {
		hint = " (" + pgErr.Hint + ")"
	}
	if pgErr.Code == "25006" { // read_only_sql_transaction
		return fmt.Errorf("-where %q writes (%s): a replay reads in READ ONLY transactions; give a condition that only reads", clause, pgErr.Message)
	}
	return fmt.Errorf("-where %q is refused by Postgres%s: %s%s (SQLSTATE %s); fix the clause: it is the body of a WHERE over the columns of %s (%s), "+
		"e.g. -where \"created_at >= '2026-01-01'\"", clause, place, pgErr.Message, hint, pgErr.Code, t.name, strings.Join(slices.Sorted(maps.Keys(t.types)), ", "))
}

// newRunID returns a run id that sorts by its start: the UTC time, then
// random hex digits.
func newRunID() string {
	var b [3]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
}

// ID returns the run's id.
func (r *Replay) ID() string { return r.state.Run }

// Resumed reports whether the run was started before, by another process.
func (r *Replay) Resumed() bool { return r.resumed }

// Close closes the Kafka client and the connection to Postgres, which
// releases the run's lock.
func (r *Replay) Close() {
	if r.producer != nil {
		r.producer.Close()
	}
	if r.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = r.conn.Close(ctx)
	}
}
