package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/internal/pause"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/wal"
)

// Summary is what a run did.
type Summary struct {
	Run   string
	Table string
	// Sent is the number of rows Kafka acknowledged, in this process and
	// the ones before it that ran the run.
	Sent int64
	// Total is the number of rows that matched when the run started.
	Total    int64
	Finished bool          // every row of the run was sent
	Took     time.Duration // in this process
}

func (s Summary) String() string {
	if !s.Finished {
		return fmt.Sprintf("replay %s of %s stopped: %d of %d rows sent; resume it with outboxd replay -resume %s", s.Run, s.Table, s.Sent, s.Total, s.Run)
	}
	msg := fmt.Sprintf("replay %s of %s finished: %d rows sent (%d matched when it started)", s.Run, s.Table, s.Sent, s.Total)
	if s.Sent < s.Total {
		msg += fmt.Sprintf("; at least %d of those were deleted before the replay read them", s.Total-s.Sent)
	}
	return msg
}

// row is one row read: its columns as pgoutput would send them, and its key
// in the run's order, as text.
type row struct {
	tuple []wal.Datum
	key   []string
}

// Run sends the run's rows, a page at a time: it reads a page in a READ
// ONLY transaction, routes and produces its rows at the rate asked, waits
// until Kafka has acknowledged them all, and records the page's last key
// as done before it reads the next. A kill therefore sends again at most
// the page in flight. When ctx ends, Run waits up to shutdown_timeout for
// the records handed over, records them, and returns the summary with a
// nil error: the run is resumable. A record Kafka refuses, a row the
// router cannot route, or a stall of kafka.delivery_timeout ends the run
// with an error; what was acknowledged before stays recorded.
func (r *Replay) Run(ctx context.Context) (Summary, error) {
	began := time.Now()
	r.log.Info("replay started", "run", r.state.Run, "table", r.state.Table, "where", r.state.Where, "order", r.state.Keys,
		"rows", r.state.Total, "rows_done", r.state.Sent, "resumed", r.resumed, "to_topic", r.state.ToTopic, "rate", r.pace.rate())
	g, gctx := errgroup.WithContext(ctx)
	watch, stopWatch := context.WithCancel(gctx)
	g.Go(func() error { return r.producer.Watch(watch, nil) })
	g.Go(func() error {
		defer stopWatch()
		return r.send(gctx)
	})
	err := g.Wait()
	sum := Summary{Run: r.state.Run, Table: r.state.Table, Sent: r.state.Sent, Total: r.state.Total, Finished: !r.state.Finished.IsZero(), Took: time.Since(began)}
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = nil // stopped by the operator: resumable
	}
	if err != nil {
		return sum, fmt.Errorf("replay %s stopped after %d of %d rows: %w; once the cause is fixed, resume it with outboxd replay -resume %s (it sends again at most the rows in flight)",
			r.state.Run, r.state.Sent, r.state.Total, err, r.state.Run)
	}
	r.log.Info("replay ended", "run", r.state.Run, "rows_done", sum.Sent, "rows_left", max(sum.Total-sum.Sent, 0), "finished", sum.Finished, "took", sum.Took.Round(time.Millisecond))
	return sum, nil
}

func (r *Replay) send(ctx context.Context) error {
	acks := make(chan error, r.batch)
	var rec router.Record
	logged, sentAtLog := time.Now(), r.state.Sent
	for r.state.End != nil {
		page, err := r.readPage(ctx)
		if err != nil {
			return err
		}
		handed, sendErr := 0, error(nil)
		for i := range page {
			if sendErr = r.wait(ctx); sendErr != nil {
				break
			}
			if sendErr = r.route(&page[i], &rec); sendErr != nil {
				break
			}
			if sendErr = r.producer.Produce(ctx, &rec, func(err error) { acks <- err }); sendErr != nil {
				var poison *router.RowError
				if errors.As(sendErr, &poison) {
					sendErr = r.unroutable(poison, page[i].key)
				}
				break
			}
			handed++
		}
		if err := r.await(ctx, acks, handed); err != nil {
			return err // nothing of the page recorded: a resumed run sends it again
		}
		if handed > 0 {
			r.state.Done, r.state.Sent = page[handed-1].key, r.state.Sent+int64(handed)
			if len(page) < r.batch && handed == len(page) && sendErr == nil {
				r.state.Finished = time.Now().UTC()
			}
			// Recorded even when ctx ended: the operator's stop keeps what
			// Kafka acknowledged.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			err := r.store.save(sctx, r.state)
			cancel()
			if err != nil {
				return err
			}
		}
		if sendErr != nil {
			return sendErr
		}
		if len(page) < r.batch {
			break
		}
		if now := time.Now(); now.Sub(logged) >= r.progress {
			r.log.Info("replay progress", "run", r.state.Run, "rows_done", r.state.Sent, "rows_left", max(r.state.Total-r.state.Sent, 0),
				"rows_per_second", int(float64(r.state.Sent-sentAtLog)/now.Sub(logged).Seconds()))
			logged, sentAtLog = now, r.state.Sent
		}
	}
	if r.state.Finished.IsZero() {
		r.state.Finished = time.Now().UTC()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return r.store.save(sctx, r.state)
	}
	return nil
}

// wait waits the pacer's delay for the next record.
func (r *Replay) wait(ctx context.Context) error {
	d := r.pace.delay(time.Now())
	if d == 0 {
		return ctx.Err()
	}
	if !pause.For(ctx, d) {
		return ctx.Err()
	}
	return nil
}

// route routes one row as the daemon routes an inserted row, and marks it
// replayed.
func (r *Replay) route(w *row, rec *router.Record) error {
	c := wal.Change{Op: wal.Insert, Relation: r.rel, Tuple: w.tuple}
	if err := r.router.RouteInto(&c, rec); err != nil {
		var poison *router.RowError
		if errors.As(err, &poison) {
			return r.unroutable(poison, w.key)
		}
		return err
	}
	if r.state.ToTopic != "" {
		rec.Topic = r.state.ToTopic
	}
	rec.Headers = append(rec.Headers, r.header)
	return nil
}

// unroutable is the stop for a row that cannot be sent: the daemon halted
// on it or dead-lettered it when it was inserted; a replay never skips a
// row, so it stops before it.
func (r *Replay) unroutable(poison *router.RowError, key []string) error {
	return fmt.Errorf("row %v of %s (in the order of %v) cannot be sent: %s; a replay sends every row it matches or stops: "+
		"fix the row, or start a new run whose -where leaves it out", key, r.state.Table, r.state.Keys, poison.Reason)
}

// await waits for n acknowledgements (AwaitAcks).
func (r *Replay) await(ctx context.Context, acks <-chan error, n int) error {
	return AwaitAcks(ctx, acks, n, r.cfg.ShutdownTimeout)
}

// AwaitAcks waits for n acknowledgements on acks. When ctx ends it waits
// on, up to grace (shutdown_timeout), for the records already handed over.
// It fails unless all n were acknowledged.
func AwaitAcks(ctx context.Context, acks <-chan error, n int, grace time.Duration) error {
	var first error
	var deadline <-chan time.Time
	done := ctx.Done()
	for got := 0; got < n; {
		select {
		case err := <-acks:
			got++
			if err != nil && first == nil {
				first = err
			}
		case <-done:
			t := time.NewTimer(grace)
			defer t.Stop()
			deadline, done = t.C, nil
		case <-deadline:
			return fmt.Errorf("%d records handed to Kafka were not acknowledged within shutdown_timeout (%s): %w", n-got, grace, context.Cause(ctx))
		}
	}
	return first
}

// readPage reads the rows after the last one done, up to the run's end, in
// a READ ONLY transaction of its own: no snapshot is held between pages, so
// a long replay does not hold back vacuum. Each row's bytes are copied: the
// records alias them until Kafka acknowledges.
func (r *Replay) readPage(ctx context.Context) ([]row, error) {
	tx, err := r.conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("reading rows of %s: %w", r.state.Table, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read only
	var params [][]byte
	for _, k := range r.state.Done {
		params = append(params, []byte(k))
	}
	for _, k := range r.state.End {
		params = append(params, []byte(k))
	}
	ncols, nkeys := len(r.rel.Columns), len(r.state.Keys)
	res := r.conn.PgConn().ExecParams(ctx, r.reads.page(r.state.Done != nil, r.batch), params, nil, nil, nil)
	var page []row
	for res.NextRow() {
		vals := res.Values()
		if len(vals) != ncols+nkeys {
			res.Close() //nolint:errcheck // the error is the column count
			return nil, fmt.Errorf("reading rows of %s: %d columns, want %d", r.state.Table, len(vals), ncols+nkeys)
		}
		size := 0
		for _, v := range vals[:ncols] {
			size += len(v)
		}
		arena := make([]byte, 0, size)
		w := row{tuple: make([]wal.Datum, ncols), key: make([]string, nkeys)}
		for i, v := range vals[:ncols] {
			if v == nil {
				w.tuple[i] = wal.Datum{Kind: wal.DatumNull}
				continue
			}
			from := len(arena)
			arena = append(arena, v...)
			w.tuple[i] = wal.Datum{Kind: wal.DatumText, Data: arena[from:len(arena):len(arena)]}
		}
		for i, v := range vals[ncols:] {
			w.key[i] = string(v)
		}
		page = append(page, w)
	}
	if _, err := res.Close(); err != nil {
		return nil, fmt.Errorf("reading rows of %s after %v (-where %q): %w", r.state.Table, r.state.Done, r.state.Where, err)
	}
	return page, tx.Commit(ctx)
}
