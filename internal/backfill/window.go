package backfill

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// The pipeline of an at-least-once backfill (issue 35 §2; `make bench`
// measured the page-at-a-time backfill at 1/7 of COPY): the next page is
// read from Postgres while Kafka works on the pages handed to it, up to a
// window of pages as large as the stream's budget of records in flight, and
// a page's last key is saved as done once Kafka acknowledged it and every
// page before it.
//
// Why this loses, skips and reorders nothing (the ack rule of DESIGN.md,
// applied to pages):
//
//   - The window holds the pages handed to Kafka, in key order. A page
//     settles only when hand is done with it (its handed count is final),
//     every record handed of it was answered, and none failed; settled
//     pops pages from the front only, and stops at the first that has not
//     settled. So the cursor saved (the last key of the last page popped)
//     never passes a row Kafka has not acknowledged: every row before it,
//     in every earlier page, was acknowledged. A page whose record failed
//     never settles, and nothing after it does either: its failure is the
//     run's error, and the next run resumes after the last page popped,
//     sending the failed page and those after it again (at-least-once:
//     repeats, never a gap).
//   - A page cut short (a row the router cannot route, a record not handed
//     over) settles with the rows handed before the cut, and ends the
//     window: no page after it is read or settles.
//   - On the first failure (a record's, a page's read, a save, ctx) the
//     run hands nothing more, waits for every record handed (at most
//     shutdown_timeout once ctx ended), saves what settled and returns the
//     failure. No record of this run is in flight when the next run starts
//     but for those still unanswered after that wait (possibly the whole
//     window), which Kafka then delivers or fails; per key, the next run's
//     records follow them. A key's order is kept because all of a key's
//     records go to one partition, where franz-go fails every record not
//     yet sent behind a failed one (records already sent are answered in
//     order): a later page of the key is never acknowledged once an
//     earlier one of it failed. A page acknowledged on another partition
//     before the failure is sent again by the next run, after the failed
//     one: per key, the first copies stay in order (what a consumer
//     deduplicating on the id header keeps), and so do the last.
//   - One writer: the window and the cursor are the sender goroutine's;
//     the records' callbacks only count answers under the window's mutex
//     and wake the sender, never block (franz-go calls them in order, and
//     a blocked one would hold the records behind it).
//   - Memory and repeats: the next page is read only while the window
//     holds fewer than kafka.max_buffered_bytes of rows and room for a
//     page within kafka.max_buffered_records rows (the stream's budget of
//     records in flight), or nothing: a backfill holds at most those bytes
//     of rows and keys plus a page (the records' headers and franz-go's
//     envelopes come on top), and a kill sends again at most the window's rows, what
//     was in flight, as the stream does (kafka.max_buffered_records rows,
//     or one page when postgres.backfill.batch is larger).
//
// Exactly-once keeps one page per Kafka transaction, as before: the next
// page is read while Kafka works on the current one, whose transaction
// commits, with its last key as the cursor, before the next is handed.

// flight is a page handed to Kafka.
type flight struct {
	rows   []row
	bytes  int // the rows' size, for the window's byte bound
	answer func(error)
	// Under window.mu:
	handed int   // rows whose records were handed over
	closed bool  // hand is done with the page: handed is final
	left   int   // records handed and not answered yet
	err    error // the first failed record's error
}

// window is the pages of a backfill handed to Kafka and not settled, in key
// order.
type window struct {
	// The bounds: rows (kafka.max_buffered_records), bytes
	// (kafka.max_buffered_bytes), and the rows of a page.
	maxRows, maxBytes, page int
	wake                    chan struct{} // a page's last answer or a failure

	mu     sync.Mutex
	pages  []*flight
	rows   int   // in pages
	bytes  int   // of the rows in pages
	left   int   // records answered by no callback yet, in all pages
	failed error // the first failed record's error
	cut    bool  // a page cut short settled: nothing after it may
}

func newWindow(maxRows, maxBytes, page int) *window {
	return &window{maxRows: maxRows, maxBytes: maxBytes, page: page, wake: make(chan struct{}, 1)}
}

// open adds page, to be handed to Kafka, at the window's end.
func (w *window) open(page []row) *flight {
	f := &flight{rows: page}
	for _, r := range page {
		for _, d := range r.tuple {
			f.bytes += len(d.Data)
		}
		for _, k := range r.key {
			f.bytes += len(k)
		}
	}
	f.answer = func(err error) { w.answered(f, err) }
	w.mu.Lock()
	w.pages = append(w.pages, f)
	w.rows += len(page)
	w.bytes += f.bytes
	w.mu.Unlock()
	return f
}

// handing counts a record of f about to be handed over; unhanded takes it
// back when it was not (f.answer is then never called).
func (w *window) handing(f *flight) {
	w.mu.Lock()
	f.left++
	w.left++
	w.mu.Unlock()
}

func (w *window) unhanded(f *flight) {
	w.mu.Lock()
	f.left--
	w.left--
	w.mu.Unlock()
}

// close records that handed rows of f were handed over, and no more will
// be.
func (w *window) close(f *flight, handed int) {
	w.mu.Lock()
	f.handed, f.closed = handed, true
	w.mu.Unlock()
	w.signal()
}

// answered is a record's callback: Kafka acknowledged it (err nil) or it
// failed. It never blocks.
func (w *window) answered(f *flight, err error) {
	w.mu.Lock()
	f.left--
	w.left--
	if err != nil {
		if f.err == nil {
			f.err = err
		}
		if w.failed == nil {
			w.failed = err
		}
	}
	wake := f.left == 0 || err != nil
	w.mu.Unlock()
	if wake {
		w.signal()
	}
}

func (w *window) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// settled pops the pages at the front that Kafka acknowledged whole (or, a
// page cut short, its rows handed), and returns how many rows they hold and
// the last one's key (nil when none).
func (w *window) settled() (n int, last []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.pages) > 0 && !w.cut {
		f := w.pages[0]
		if !f.closed || f.left > 0 || f.err != nil {
			break
		}
		if f.handed > 0 {
			n, last = n+f.handed, f.rows[f.handed-1].key
		}
		w.cut = f.handed < len(f.rows)
		w.pages[0] = nil
		w.pages = w.pages[1:]
		w.rows -= len(f.rows)
		w.bytes -= f.bytes
	}
	return n, last
}

// err is the first record's failure, nil while none failed.
func (w *window) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failed
}

// full reports whether the window must settle a page before the next is
// read: it holds pages, and another would take it past maxRows rows, or
// it holds maxBytes of rows.
func (w *window) full() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pages) > 0 && (w.rows+w.page > w.maxRows || w.bytes >= w.maxBytes)
}

// empty reports whether no page is in the window.
func (w *window) empty() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pages) == 0
}

// wait waits for an answer that may settle a page, or a failure.
func (w *window) wait(ctx context.Context) error {
	select {
	case <-w.wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drain waits until every record handed over was answered; once ctx ends,
// grace at most (replay.AwaitAcks).
func (w *window) drain(ctx context.Context, grace time.Duration) error {
	var deadline <-chan time.Time
	done := ctx.Done()
	for {
		w.mu.Lock()
		left := w.left
		w.mu.Unlock()
		if left == 0 {
			return nil
		}
		select {
		case <-w.wake:
		case <-done:
			t := time.NewTimer(grace)
			defer t.Stop()
			deadline, done = t.C, nil
		case <-deadline:
			return fmt.Errorf("%d records handed to Kafka were not acknowledged within shutdown_timeout (%s): %w", left, grace, context.Cause(ctx))
		}
	}
}
