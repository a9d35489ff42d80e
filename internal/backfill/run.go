package backfill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/eos"
	"github.com/outboxd/outboxd/internal/pause"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/internal/replay"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// Metrics are the backfill's progress.
type Metrics struct {
	rows      prometheus.Counter
	remaining prometheus.Gauge
}

// NewMetrics registers the backfill's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		rows: prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_backfill_rows_total",
			Help: "Rows of the backfill (postgres.backfill) Kafka acknowledged, by this process."}),
		remaining: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outboxd_backfill_rows_remaining",
			Help: "Rows of the backfill not yet acknowledged; 0 once it is done."}),
	}
	reg.MustRegister(m.rows, m.remaining)
	return m
}

// progressEvery is the time between two progress lines in the log.
const progressEvery = 10 * time.Second

// Backfill is a backfill under way that Open found; Run sends its rows.
type Backfill struct {
	conn *pgx.Conn // holds the backfill's lock
	b    *sender
}

// Open reads the slot's backfill (the package's duty 2). It returns nil
// when the backfill is done, and otherwise the backfill, locked: only one
// process sends it at a time (a session advisory lock; another waits in
// Open). Close releases it.
func Open(ctx context.Context, cfg config.Config, log *slog.Logger) (_ *Backfill, err error) {
	conn, err := pg.Connect(ctx, cfg.Postgres)
	if err != nil {
		return nil, err
	}
	defer func() {
		if conn != nil { // not handed to the Backfill
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	pc := cfg.Postgres
	if _, err := lock(ctx, conn, pc.Slot); err != nil {
		return nil, err // released when conn closes
	}
	s := newStore(cfg)
	st, found, err := s.load(ctx, conn, pc.Slot)
	if err != nil {
		return nil, err
	}
	if !found || st.Phase == phaseSnapshot {
		return nil, fmt.Errorf("the backfill of slot %q has not fixed its rows; restart outboxd, whose start-up check does", pc.Slot)
	}
	if st.Phase == phaseDone {
		return nil, nil
	}
	src, err := replay.OpenSource(ctx, conn, cfg, st.Keys[0])
	if err != nil {
		return nil, fmt.Errorf("postgres.backfill: %w", err)
	}
	if !slices.Equal(src.Keys, st.Keys) {
		return nil, fmt.Errorf("the backfill of slot %q pages by %v, and the table's order and primary key are now %v; restore the primary key, or start the backfill again (DELETE FROM %s WHERE slot = '%s', drop the slot)",
			pc.Slot, st.Keys, src.Keys, s.name, pc.Slot)
	}
	b := &sender{cfg: cfg, log: log, conn: conn, store: s, state: st, src: src}
	b.page = b.pageSQL()
	bf := &Backfill{conn: conn, b: b}
	conn = nil // the Backfill's now
	return bf, nil
}

// Run sends the rows Kafka has not acknowledged yet through producer, and
// records the backfill done. When ctx ends it returns ctx's error; what
// Kafka acknowledged stays recorded. progress is called with the rows sent
// and the rows to send, at the start and after each page.
func (bf *Backfill) Run(ctx context.Context, producer *sink.Producer, m *Metrics, progress func(sent, total int64)) error {
	return bf.run(ctx, producer, m, progress)
}

// RunExactlyOnce is Run in kafka.delivery: exactly_once (exactly.go).
// producer is the slot's transactional producer, initialised after Open
// locked the backfill (fencing the id's previous holder, whose open
// transaction Kafka aborts), and k what its id last committed, read after
// that. It goes on after the cursor Kafka committed, and sends the rows in
// Kafka transactions, each writing the cursor after its last row.
func (bf *Backfill) RunExactlyOnce(ctx context.Context, producer *sink.Producer, k Committed, m *Metrics, progress func(sent, total int64)) (err error) {
	b := bf.b
	r, err := resume(b.state, k, b.store)
	if err != nil {
		return err
	}
	if r.note != "" {
		b.log.Warn("exactly-once backfill: "+r.note, "slot", b.state.Slot, "rows_done", b.state.Sent, "transactional_id", k.Owner.ID)
	}
	if r.fromKafka && (r.Sent != b.state.Sent || r.finished) {
		b.log.Info("exactly-once backfill: going on after the rows Kafka committed; Postgres had recorded fewer", "slot", b.state.Slot,
			"rows_done", r.Sent, "rows_recorded", b.state.Sent, "all_sent", r.finished, "transactional_id", k.Owner.ID)
	}
	b.state, b.finished = r.State, r.finished
	b.txn = &txns{p: producer, owner: k.Owner, limits: eos.LimitsOf(b.cfg.Kafka)}
	defer func() { err = b.txn.end(ctx, err) }()
	return bf.run(ctx, producer, m, progress)
}

func (bf *Backfill) run(ctx context.Context, producer *sink.Producer, m *Metrics, progress func(sent, total int64)) error {
	b := bf.b
	b.producer, b.m, b.progress = producer, m, progress
	g, gctx := errgroup.WithContext(ctx)
	watch, stopWatch := context.WithCancel(gctx)
	g.Go(func() error { return producer.Watch(watch, nil) })
	g.Go(func() error {
		defer stopWatch()
		return b.send(gctx)
	})
	return g.Wait()
}

// Close releases the backfill's connection and lock.
func (bf *Backfill) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bf.conn.Close(ctx)
}

// sender sends a backfill's pages.
type sender struct {
	cfg      config.Config
	log      *slog.Logger
	conn     *pgx.Conn
	store    store
	state    State
	src      replay.Source
	producer *sink.Producer
	m        *Metrics
	page     string // the SQL of a page after a key
	first    string // the SQL of the first page
	sentHere int64  // rows acknowledged in this process
	progress func(sent, total int64)
	// Exactly-once only: the Kafka side, when the state was last saved
	// (every saveEvery at most: Kafka's cursor is the one that counts),
	// and whether Kafka holds every row already (resume).
	txn      *txns
	saved    time.Time
	finished bool
}

// saveEvery is how often an exactly-once backfill saves its cursor in
// Postgres, for progress only: a resumed run goes on after the cursor in
// Kafka.
const saveEvery = time.Second

// pageSQL builds the statements that read a page: the rows of the key
// table (the rows as the snapshot saw them) after the key in $1.., in the
// key order.
func (b *sender) pageSQL() string {
	var cols, keys []string
	for _, c := range b.src.Relation.Columns {
		cols = append(cols, "k."+pgx.Identifier{c.Name}.Sanitize())
	}
	for _, k := range b.state.Keys {
		keys = append(keys, "k."+pgx.Identifier{k}.Sanitize())
	}
	head := "SELECT " + strings.Join(cols, ", ") + ", " + strings.Join(keys, ", ") + " FROM " + b.store.keys + " k"
	order := fmt.Sprintf(" ORDER BY %s LIMIT %d", strings.Join(keys, ", "), b.cfg.Postgres.Backfill.Batch)
	params := make([]string, len(keys))
	for i := range params {
		params[i] = fmt.Sprintf("$%d", i+1)
	}
	b.first = head + order
	return head + " WHERE (" + strings.Join(keys, ", ") + ") > (" + strings.Join(params, ", ") + ")" + order
}

// row is one row read: its columns as pgoutput would send them and its key.
type row struct {
	tuple []wal.Datum
	key   []string
}

func (b *sender) send(ctx context.Context) error {
	st := &b.state
	b.m.remaining.Set(float64(max(st.Total-st.Sent, 0)))
	b.progress(st.Sent, st.Total)
	b.log.Info("backfill started", "slot", st.Slot, "table", st.Table, "where", st.Where, "order", st.Keys, "rows", st.Total,
		"rows_done", st.Sent, "rows_left", max(st.Total-st.Sent, 0), "resumed", st.Sent > 0 || st.Done != nil)
	acks := make(chan error, b.cfg.Postgres.Backfill.Batch)
	var rec router.Record
	began, logged := time.Now(), time.Now()
	for !b.finished {
		page, err := b.readPage(ctx)
		if err != nil {
			return err
		}
		if len(page) == 0 {
			break
		}
		last := len(page) < b.cfg.Postgres.Backfill.Batch
		handed, recorded := 0, 0 // rows handed to Kafka, and of them recorded
		var sendErr error
		for i := range page {
			c := wal.Change{Op: wal.Insert, Relation: b.src.Relation, Tuple: page[i].tuple}
			if sendErr = b.src.Router.RouteInto(&c, &rec); sendErr != nil {
				break
			}
			if b.txn != nil {
				now := time.Now()
				if b.txn.due(now) {
					if err := b.record(ctx, page[recorded:handed], false); err != nil {
						return err
					}
					recorded = handed
				}
				if err := b.txn.add(now, rec.Size()); err != nil {
					return err
				}
			}
			if sendErr = b.producer.Produce(ctx, &rec, func(err error) { acks <- err }); sendErr != nil {
				break
			}
			handed++
		}
		if err := replay.AwaitAcks(ctx, acks, handed, b.cfg.ShutdownTimeout); err != nil {
			return err
		}
		if handed > recorded {
			if err := b.record(ctx, page[recorded:handed], last && handed == len(page)); err != nil {
				return err
			}
		}
		if sendErr != nil {
			var poison *router.RowError
			if errors.As(sendErr, &poison) {
				return fmt.Errorf("backfill: row %[1]v of %[2]s (in the order of %[3]v) cannot be sent: %[5]w; the backfill sends every row it fixed or stops. "+
					"It sends the row as copied into %[4]s when the slot was made: fix it there (UPDATE %[4]s SET … WHERE …) and restart outboxd",
					page[handed].key, st.Table, st.Keys, b.store.keys, poison)
			}
			return sendErr
		}
		if now := time.Now(); now.Sub(logged) >= progressEvery {
			b.log.Info("backfill progress", "slot", st.Slot, "rows_done", st.Sent, "rows_left", max(st.Total-st.Sent, 0))
			logged = now
		}
		if err := b.pace(ctx, began, handed); err != nil {
			return err
		}
		if last {
			break
		}
	}
	return b.finish(ctx, began)
}

// record records rows, the next ones after the state's cursor, as in
// Kafka: in exactly-once mode it first commits the open Kafka transaction,
// which holds them, with the cursor after them (done: they are the last
// ones). It saves the state in Postgres, after each page in at-least-once
// mode, at most every saveEvery in exactly-once mode, and shows the
// progress.
func (b *sender) record(ctx context.Context, rows []row, done bool) error {
	if len(rows) == 0 {
		return nil
	}
	st := &b.state
	st.Done, st.Sent = rows[len(rows)-1].key, st.Sent+int64(len(rows))
	if b.txn != nil {
		if err := b.txn.commit(ctx, cursorOf(*st, done)); err != nil {
			return err
		}
	}
	if now := time.Now(); b.txn == nil || now.Sub(b.saved) >= saveEvery {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := b.store.save(sctx, b.conn, *st)
		cancel()
		if err != nil {
			return err
		}
		b.saved = now
	}
	b.m.rows.Add(float64(len(rows)))
	b.m.remaining.Set(float64(max(st.Total-st.Sent, 0)))
	b.progress(st.Sent, st.Total)
	return nil
}

// pace waits so that the rows sent by this process keep to
// postgres.backfill.rate.
func (b *sender) pace(ctx context.Context, began time.Time, handed int) error {
	b.sentHere += int64(handed)
	rate := b.cfg.Postgres.Backfill.Rate
	if rate == 0 {
		return nil
	}
	due := began.Add(time.Duration(float64(b.sentHere) / float64(rate) * float64(time.Second)))
	if d := time.Until(due); d > 0 && !pause.For(ctx, d) {
		return ctx.Err()
	}
	return nil
}

// finish records the backfill done and drops its key table, in one
// transaction.
func (b *sender) finish(ctx context.Context, began time.Time) error {
	st := &b.state
	st.Phase, st.Finished = phaseDone, time.Now().UTC()
	tx, err := b.conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("recording the backfill done: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit, a no-op
	if err := b.store.save(ctx, tx, *st); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "DROP TABLE IF EXISTS "+b.store.keys); err != nil {
		return fmt.Errorf("dropping the backfill's key table %s: %w", b.store.keys, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("recording the backfill done: %w", err)
	}
	b.m.remaining.Set(0)
	b.log.Info("backfill done; streaming from the slot", "slot", st.Slot, "rows_done", st.Sent, "rows", st.Total,
		"took", time.Since(began).Round(time.Millisecond))
	return nil
}

// readPage reads the rows after the last one done. Each row's bytes are
// copied: the records alias them until Kafka acknowledges.
func (b *sender) readPage(ctx context.Context) ([]row, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sql, params := b.first, [][]byte(nil)
	if b.state.Done != nil {
		sql = b.page
		for _, k := range b.state.Done {
			params = append(params, []byte(k))
		}
	}
	ncols, nkeys := len(b.src.Relation.Columns), len(b.state.Keys)
	res := b.conn.PgConn().ExecParams(ctx, sql, params, nil, nil, nil)
	var page []row
	for res.NextRow() {
		vals := res.Values()
		if len(vals) != ncols+nkeys {
			res.Close() //nolint:errcheck // the error is the column count
			return nil, fmt.Errorf("reading rows of %s: %d columns, want %d", b.state.Table, len(vals), ncols+nkeys)
		}
		w := row{tuple: make([]wal.Datum, ncols), key: make([]string, nkeys)}
		for i, v := range vals[:ncols] {
			if v == nil {
				w.tuple[i] = wal.Datum{Kind: wal.DatumNull}
				continue
			}
			w.tuple[i] = wal.Datum{Kind: wal.DatumText, Data: append([]byte(nil), v...)}
		}
		for i, v := range vals[ncols:] {
			w.key[i] = string(v)
		}
		page = append(page, w)
	}
	if _, err := res.Close(); err != nil {
		return nil, fmt.Errorf("reading rows of %s to backfill after %v: %w", b.state.Table, b.state.Done, err)
	}
	return page, nil
}
