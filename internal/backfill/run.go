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
	b.read = b.readPage
	b.save = func(ctx context.Context, st State) error { return s.save(ctx, b.conn, st) }
	bf := &Backfill{conn: conn, b: b}
	conn = nil // the Backfill's now
	return bf, nil
}

// Run sends the rows Kafka has not acknowledged yet through producer, and
// records the backfill done. When ctx ends it returns ctx's error; what
// Kafka acknowledged stays recorded. progress is called with the rows sent
// and the rows to send, at the start and each time pages are recorded.
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
	sentHere int64  // rows handed to Kafka by this process, for the rate
	progress func(sent, total int64)
	// read reads the page after a key (readPage); save saves the state
	// (store.save on conn). Tests give their own.
	read func(ctx context.Context, after []string) ([]row, error)
	save func(ctx context.Context, st State) error
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
	began := time.Now()
	if !b.finished {
		if err := b.pipe(ctx, began); err != nil {
			return err
		}
	}
	return b.finish(ctx, began)
}

// pipe sends the rows after the state's cursor, page by page, reading the
// next page while Kafka works on those handed over (window.go says why
// that keeps the ack rule), and records them as Kafka acknowledges them.
func (b *sender) pipe(ctx context.Context, began time.Time) error {
	st := &b.state
	batch, grace := b.cfg.Postgres.Backfill.Batch, b.cfg.ShutdownTimeout
	w := newWindow(b.cfg.Kafka.MaxBufferedRecords, b.cfg.Kafka.MaxBufferedBytes, batch)
	logged := time.Now()
	next, err := b.read(ctx, st.Done)
	if err != nil {
		return err
	}
	for len(next) > 0 {
		page := next
		next = nil
		last := len(page) < batch
		f, recorded, sendErr, err := b.hand(ctx, w, page)
		if err != nil {
			return err // exactly-once: a commit or a Begin failed; txns.end aborts
		}
		if b.txn != nil {
			// Exactly-once: the page's transaction commits, with the cursor
			// after its last row handed, before the next page is handed;
			// the next page is read while Kafka sends this one.
			var readErr error
			if sendErr == nil && !last && w.err() == nil {
				next, readErr = b.readNext(ctx, page[len(page)-1].key)
			}
			if err := w.drain(ctx, grace); err != nil {
				return err
			}
			if err := w.err(); err != nil {
				return err
			}
			n, key := w.settled()
			if n -= recorded; n > 0 {
				if err := b.record(ctx, n, key, last && f.handed == len(page)); err != nil {
					return err
				}
			}
			if sendErr != nil {
				return b.rowError(f, sendErr)
			}
			if readErr != nil {
				return readErr
			}
		} else {
			// At-least-once: record the pages Kafka acknowledged with all
			// before them; at the window's bound, wait for its first page
			// to settle; then read the next page while Kafka works on the
			// window.
			if sendErr != nil {
				return b.halt(ctx, w, f, sendErr, nil)
			}
			if err := b.recordSettled(ctx, w); err != nil {
				return b.halt(ctx, w, nil, err, nil)
			}
			for w.full() && w.err() == nil {
				if err := w.wait(ctx); err != nil {
					return b.halt(ctx, w, nil, err, nil)
				}
				if err := b.recordSettled(ctx, w); err != nil {
					return b.halt(ctx, w, nil, err, nil)
				}
			}
			if w.err() != nil {
				return b.halt(ctx, w, nil, nil, nil)
			}
			if !last {
				var readErr error
				if next, readErr = b.readNext(ctx, page[len(page)-1].key); readErr != nil {
					return b.halt(ctx, w, nil, nil, readErr)
				}
			}
		}
		if now := time.Now(); now.Sub(logged) >= progressEvery {
			b.log.Info("backfill progress", "slot", st.Slot, "rows_done", st.Sent, "rows_left", max(st.Total-st.Sent, 0))
			logged = now
		}
		if err := b.pace(ctx, began, f.handed); err != nil {
			if b.txn == nil {
				return b.halt(ctx, w, nil, err, nil)
			}
			return err
		}
		if last {
			break
		}
	}
	if b.txn == nil { // the window's pages are still in flight
		if err := b.halt(ctx, w, nil, nil, nil); err != nil {
			return err
		}
		if !w.empty() {
			return fmt.Errorf("backfill of slot %q: pages handed to Kafka did not settle although every record was answered", st.Slot)
		}
	}
	return nil
}

// readNextTimeout bounds the read of a page while pages are in flight.
const readNextTimeout = time.Minute

// readNext reads the page after key while pages are in flight, and then
// reports ctx's end. The read itself is not under ctx: pgx closes a
// connection whose query's context ends, and with it the backfill's lock
// (a second outboxd would send the same rows while these are in flight),
// and the saves of what settles while the run drains would fail.
func (b *sender) readNext(ctx context.Context, key []string) ([]row, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readNextTimeout)
	defer cancel()
	page, err := b.read(rctx, key)
	if err == nil {
		err = ctx.Err()
	}
	return page, err
}

// hand routes page's rows and hands their records to Kafka, as a flight of
// w. It stops at the first row it cannot route or hand over (sendErr). In
// exactly-once mode it commits the open Kafka transaction where it is due
// (split), before a row: recorded is how many of the page's rows those
// commits hold. err is a failure of that, which ends the run at once.
func (b *sender) hand(ctx context.Context, w *window, page []row) (f *flight, recorded int, sendErr, err error) {
	f = w.open(page)
	handed := 0
	defer func() { w.close(f, handed) }()
	var rec router.Record
	for i := range page {
		c := wal.Change{Op: wal.Insert, Relation: b.src.Relation, Tuple: page[i].tuple}
		if sendErr = b.src.Router.RouteInto(&c, &rec); sendErr != nil {
			return f, recorded, sendErr, nil
		}
		if b.txn != nil {
			now := time.Now()
			if b.txn.due(now) && handed > recorded {
				// Commit flushes: every record handed is answered when it returns nil.
				if err := b.record(ctx, handed-recorded, page[handed-1].key, false); err != nil {
					return f, recorded, nil, err
				}
				recorded = handed
			}
			if err := b.txn.add(now, rec.Size()); err != nil {
				return f, recorded, nil, err
			}
		}
		w.handing(f)
		if sendErr = b.producer.Produce(ctx, &rec, f.answer); sendErr != nil {
			w.unhanded(f)
			return f, recorded, sendErr, nil
		}
		handed++
	}
	return f, recorded, nil, nil
}

// halt ends an at-least-once run, at its end or early with cause (a row of
// cut, a flight cut short, that cannot be sent; a page not read; a save;
// ctx): it hands nothing more, waits for every record handed
// (shutdown_timeout at most once ctx ended), records what settled, and
// returns the first of: a record's failure, the wait's, cause, readErr, the
// save's (nil when all is well).
func (b *sender) halt(ctx context.Context, w *window, cut *flight, cause, readErr error) error {
	waitErr := w.drain(ctx, b.cfg.ShutdownTimeout)
	saveErr := b.recordSettled(ctx, w)
	switch {
	case w.err() != nil:
		return w.err()
	case waitErr != nil:
		return waitErr
	case cause != nil && cut != nil:
		return b.rowError(cut, cause)
	case cause != nil:
		return cause
	case readErr != nil:
		return readErr
	}
	return saveErr
}

// rowError is sendErr, the failure to send the row of f after those
// handed, with the row named when the router cannot route it.
func (b *sender) rowError(f *flight, sendErr error) error {
	var poison *router.RowError
	if !errors.As(sendErr, &poison) || f.handed >= len(f.rows) {
		return sendErr
	}
	st := &b.state
	return fmt.Errorf("backfill: row %[1]v of %[2]s (in the order of %[3]v) cannot be sent: %[5]w; the backfill sends every row it fixed or stops. "+
		"It sends the row as copied into %[4]s when the slot was made: fix it there (UPDATE %[4]s SET … WHERE …) and restart outboxd",
		f.rows[f.handed].key, st.Table, st.Keys, b.store.keys, poison)
}

// recordSettled records the pages of w that settled.
func (b *sender) recordSettled(ctx context.Context, w *window) error {
	n, key := w.settled()
	if n == 0 {
		return nil
	}
	return b.record(ctx, n, key, false)
}

// record records n rows, the next ones after the state's cursor, the last
// of them keyed last, as in Kafka: in exactly-once mode it first commits
// the open Kafka transaction, which holds them, with the cursor after them
// (done: they are the last ones). It saves the state in Postgres, each
// time pages settle in at-least-once mode, at most every saveEvery in
// exactly-once mode, and shows the progress.
func (b *sender) record(ctx context.Context, n int, last []string, done bool) error {
	if n == 0 {
		return nil
	}
	st := &b.state
	st.Done, st.Sent = last, st.Sent+int64(n)
	if b.txn != nil {
		if err := b.txn.commit(ctx, cursorOf(*st, done)); err != nil {
			return err
		}
	}
	// The rows are in Kafka now: they count, whether or not the save
	// below fails (a failed save is retried when the run halts).
	b.m.rows.Add(float64(n))
	b.m.remaining.Set(float64(max(st.Total-st.Sent, 0)))
	b.progress(st.Sent, st.Total)
	if now := time.Now(); b.txn == nil || now.Sub(b.saved) >= saveEvery {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := b.save(sctx, *st)
		cancel()
		if err != nil {
			return err
		}
		b.saved = now
	}
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

// readPage reads the rows after the key after (the first page when nil).
// Each row's bytes are copied: the records alias them until Kafka
// acknowledges.
func (b *sender) readPage(ctx context.Context, after []string) ([]row, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sql, params := b.first, [][]byte(nil)
	if after != nil {
		sql = b.page
		for _, k := range after {
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
		return nil, fmt.Errorf("reading rows of %s to backfill after %v: %w", b.state.Table, after, err)
	}
	return page, nil
}
