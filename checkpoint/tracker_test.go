package checkpoint_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/outboxd/outboxd/checkpoint"
)

// A scenario step: an operation on a named transaction and, after it, the
// expected Confirmed position.
type op struct {
	do   string // begin, add, ack, commit, idle
	tx   string
	n    int           // add/ack: how many records; idle: unused
	lsn  pglogrepl.LSN // commit: end LSN; idle: WAL end
	want pglogrepl.LSN // Confirmed() after the step
	idle bool          // idle: expected return value
}

func begin(tx string, want pglogrepl.LSN) op { return op{do: "begin", tx: tx, want: want} }
func add(tx string, n int, want pglogrepl.LSN) op {
	return op{do: "add", tx: tx, n: n, want: want}
}
func ack(tx string, n int, want pglogrepl.LSN) op {
	return op{do: "ack", tx: tx, n: n, want: want}
}
func commit(tx string, end, want pglogrepl.LSN) op {
	return op{do: "commit", tx: tx, lsn: end, want: want}
}
func idle(walEnd pglogrepl.LSN, advanced bool, want pglogrepl.LSN) op {
	return op{do: "idle", lsn: walEnd, idle: advanced, want: want}
}

func TestTrackerScenarios(t *testing.T) {
	const start = 0x100
	tests := []struct {
		name string
		ops  []op
	}{
		{"in order", []op{
			begin("a", start), add("a", 2, start), commit("a", 0x200, start),
			ack("a", 1, start), ack("a", 1, 0x200),
			begin("b", 0x200), add("b", 1, 0x200), commit("b", 0x300, 0x200), ack("b", 1, 0x300),
		}},
		{"acks before commit", []op{
			begin("a", start), add("a", 2, start), ack("a", 2, start), commit("a", 0x200, 0x200),
		}},
		{"later transaction acked first", []op{
			begin("a", start), add("a", 2, start), commit("a", 0x200, start),
			begin("b", start), add("b", 1, start), commit("b", 0x300, start),
			begin("c", start), add("c", 3, start), commit("c", 0x400, start),
			ack("c", 3, start), // highest seen is 0x400: never confirm it
			ack("b", 1, start),
			ack("a", 1, start),
			ack("a", 1, 0x400), // the gap closes: contiguous up to c
		}},
		{"gap holds the rest", []op{
			begin("a", start), add("a", 1, start), commit("a", 0x200, start),
			begin("b", start), add("b", 1, start), commit("b", 0x300, start),
			begin("c", start), add("c", 1, start), commit("c", 0x400, start),
			begin("d", start), add("d", 1, start), commit("d", 0x500, start),
			ack("b", 1, start), ack("d", 1, start),
			ack("a", 1, 0x300), // a and b; c still missing
			ack("c", 1, 0x500),
		}},
		{"middle gap", []op{
			begin("a", start), add("a", 1, start), commit("a", 0x200, start),
			begin("b", start), add("b", 2, start), commit("b", 0x300, start),
			begin("c", start), add("c", 1, start), commit("c", 0x400, start),
			ack("a", 1, 0x200), ack("c", 1, 0x200), ack("b", 1, 0x200), ack("b", 1, 0x400),
		}},
		{"empty transactions", []op{
			begin("a", start), commit("a", 0x200, 0x200),
			begin("b", 0x200), add("b", 1, 0x200), commit("b", 0x300, 0x200),
			begin("c", 0x200), commit("c", 0x400, 0x200), // empty, but behind b
			begin("d", 0x200), commit("d", 0x500, 0x200),
			ack("b", 1, 0x500),
		}},
		{"open transaction holds later ones", []op{
			begin("a", start), add("a", 1, start),
			begin("b", start), add("b", 1, start), commit("b", 0x300, start),
			ack("b", 1, start),
			ack("a", 1, start), // fully acked, but not committed
			idle(0x900, false, start),
			commit("a", 0x200, 0x300),
		}},
		{"open empty transaction holds later ones", []op{
			begin("a", start),
			begin("b", start), commit("b", 0x300, start),
			idle(0x900, false, start),
			commit("a", 0x200, 0x300),
		}},
		{"idle when nothing pending", []op{
			idle(0x180, true, 0x180),
			idle(0x180, false, 0x180),
			idle(0x150, false, 0x180), // never backwards
			begin("a", 0x180), add("a", 1, 0x180),
			idle(0x300, false, 0x180), // open with a record in flight
			commit("a", 0x200, 0x180),
			idle(0x300, false, 0x180), // committed, not acked
			ack("a", 1, 0x200),
			idle(0x300, true, 0x300),
			idle(0x2ff, false, 0x300),
		}},
		{"idle while only an empty transaction is open", []op{
			begin("a", start),
			idle(0x300, false, start),
			commit("a", 0x200, 0x200),
			idle(0x300, true, 0x300),
		}},
		{"idle below start", []op{
			idle(0x50, false, start),
			idle(0, false, start),
		}},
		{"commit end below confirmed does not go back", []op{
			idle(0x500, true, 0x500),
			begin("a", 0x500), add("a", 1, 0x500), commit("a", 0x400, 0x500), ack("a", 1, 0x500),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := checkpoint.New(start)
			txs := map[string]*checkpoint.Txn{}
			for i, o := range tt.ops {
				x := txs[o.tx]
				switch o.do {
				case "begin":
					txs[o.tx] = tr.Begin()
				case "add":
					for range o.n {
						x.Add()
					}
				case "ack":
					for range o.n {
						x.Ack()
					}
				case "commit":
					x.Commit(o.lsn)
				case "idle":
					if got := tr.Idle(o.lsn); got != o.idle {
						t.Errorf("step %d: Idle(%s) = %t, want %t", i, o.lsn, got, o.idle)
					}
				}
				if got := tr.Confirmed(); got != o.want {
					t.Fatalf("step %d (%s %s %d %s): Confirmed() = %s, want %s", i, o.do, o.tx, o.n, o.lsn, got, o.want)
				}
			}
		})
	}
}

func TestTrackerCounts(t *testing.T) {
	tr := checkpoint.New(0)
	if tr.InFlight() != 0 || tr.Pending() != 0 {
		t.Fatalf("new tracker: InFlight %d, Pending %d", tr.InFlight(), tr.Pending())
	}
	a := tr.Begin()
	a.Add()
	a.Add()
	b := tr.Begin()
	b.Add()
	check := func(inFlight, pending int) {
		t.Helper()
		if got := tr.InFlight(); got != inFlight {
			t.Errorf("InFlight() = %d, want %d", got, inFlight)
		}
		if got := tr.Pending(); got != pending {
			t.Errorf("Pending() = %d, want %d", got, pending)
		}
	}
	check(3, 2)
	b.Commit(20)
	b.Ack()
	check(2, 2)
	a.Commit(10)
	a.Ack()
	check(1, 2)
	a.Ack()
	check(0, 0)
	if got := tr.Confirmed(); got != 20 {
		t.Errorf("Confirmed() = %s, want 0/14", got)
	}
}

// TestTrackerCompaction drives the queue far enough that its front is
// reclaimed while transactions are still pending.
func TestTrackerCompaction(t *testing.T) {
	const n = 3000
	tr := checkpoint.New(0)
	txs := make([]*checkpoint.Txn, n)
	for i := range txs {
		txs[i] = tr.Begin()
		txs[i].Add()
		txs[i].Commit(pglogrepl.LSN(i + 1))
	}
	for i := range 2001 {
		txs[i].Ack()
		if got, want := tr.Confirmed(), pglogrepl.LSN(i+1); got != want {
			t.Fatalf("after acking %d: Confirmed() = %s, want %s", i, got, want)
		}
	}
	if got := tr.Pending(); got != n-2001 {
		t.Fatalf("Pending() = %d, want %d", got, n-2001)
	}
	// More transactions after the queue was compacted.
	for i := n; i < n+10; i++ {
		x := tr.Begin()
		x.Add()
		x.Commit(pglogrepl.LSN(i + 1))
		txs = append(txs, x)
	}
	for i := len(txs) - 1; i > 2001; i-- {
		txs[i].Ack()
		if got := tr.Confirmed(); got != 2001 {
			t.Fatalf("after acking %d in reverse: Confirmed() = %s, want 0/7D1", i, got)
		}
	}
	txs[2001].Ack()
	if got, want := tr.Confirmed(), pglogrepl.LSN(len(txs)); got != want {
		t.Fatalf("Confirmed() = %s, want %s", got, want)
	}
	if tr.Pending() != 0 || tr.InFlight() != 0 {
		t.Fatalf("Pending %d, InFlight %d, want 0, 0", tr.Pending(), tr.InFlight())
	}
}

func TestAckWithoutAddPanics(t *testing.T) {
	tests := []struct {
		name  string
		setup func(tr *checkpoint.Tracker) *checkpoint.Txn
	}{
		{"fresh transaction", func(tr *checkpoint.Tracker) *checkpoint.Txn { return tr.Begin() }},
		{"committed empty transaction", func(tr *checkpoint.Tracker) *checkpoint.Txn {
			x := tr.Begin()
			x.Commit(10)
			return x
		}},
		{"one ack too many", func(tr *checkpoint.Tracker) *checkpoint.Txn {
			x := tr.Begin()
			x.Add()
			x.Ack()
			return x
		}},
		{"another transaction's add", func(tr *checkpoint.Tracker) *checkpoint.Txn {
			tr.Begin().Add()
			return tr.Begin()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := checkpoint.New(5)
			x := tt.setup(tr)
			inFlight := tr.InFlight()
			func() {
				defer func() {
					r := recover()
					if r == nil {
						t.Fatal("Ack without a matching Add did not panic")
					}
					if !strings.Contains(fmt.Sprint(r), "Ack without a matching Add") {
						t.Errorf("panic value %v", r)
					}
				}()
				x.Ack()
			}()
			// The tracker stays usable: the lock was released, nothing changed.
			if got := tr.InFlight(); got != inFlight {
				t.Errorf("InFlight() = %d after the panic, want %d", got, inFlight)
			}
			if got := tr.Confirmed(); got < 5 {
				t.Errorf("Confirmed() = %s", got)
			}
		})
	}
}

func TestWaitAcked(t *testing.T) {
	t.Run("nothing in flight", func(t *testing.T) {
		tr := checkpoint.New(0)
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // even with a done context, nothing to wait for
		if err := tr.WaitAcked(ctx); err != nil {
			t.Fatalf("WaitAcked() = %v, want nil", err)
		}
	})
	t.Run("returns when the last ack arrives", func(t *testing.T) {
		tr := checkpoint.New(0)
		x, y := tr.Begin(), tr.Begin()
		x.Add()
		y.Add()
		y.Add()
		done := make(chan error, 1)
		go func() { done <- tr.WaitAcked(context.Background()) }()
		for _, a := range []*checkpoint.Txn{y, x} {
			a.Ack()
			select {
			case err := <-done:
				t.Fatalf("WaitAcked returned %v with %d records in flight", err, tr.InFlight())
			default:
			}
		}
		y.Ack()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("WaitAcked() = %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("WaitAcked did not return after the last ack")
		}
	})
	t.Run("in flight drops to zero more than once", func(t *testing.T) {
		tr := checkpoint.New(0)
		x := tr.Begin()
		for range 3 {
			x.Add()
			x.Ack()
		}
		x.Add()
		done := make(chan error, 1)
		go func() { done <- tr.WaitAcked(context.Background()) }()
		x.Ack()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("many waiters", func(t *testing.T) {
		tr := checkpoint.New(0)
		x := tr.Begin()
		x.Add()
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() { errs <- tr.WaitAcked(context.Background()) })
		}
		x.Ack()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("context canceled", func(t *testing.T) {
		tr := checkpoint.New(0)
		tr.Begin().Add()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- tr.WaitAcked(ctx) }()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitAcked() = %v, want context.Canceled", err)
		}
	})
	t.Run("context deadline", func(t *testing.T) {
		tr := checkpoint.New(0)
		tr.Begin().Add()
		ctx, cancel := context.WithDeadline(context.Background(), time.Now())
		defer cancel()
		if err := tr.WaitAcked(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitAcked() = %v, want context.DeadlineExceeded", err)
		}
	})
}

// model is the reference answer for the ack rule: the end LSN of the last
// transaction of the contiguous prefix whose transactions are committed with
// every record acked.
type model struct {
	mu        sync.Mutex
	start     pglogrepl.LSN
	remaining []int
	committed []bool
	ends      []pglogrepl.LSN
	prefix    int // transactions [0, prefix) are done
}

func (m *model) begin() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.remaining = append(m.remaining, 0)
	m.committed = append(m.committed, false)
	m.ends = append(m.ends, 0)
	return len(m.remaining) - 1
}

func (m *model) add(i int) { m.mu.Lock(); m.remaining[i]++; m.mu.Unlock() }
func (m *model) ack(i int) { m.mu.Lock(); m.remaining[i]--; m.mu.Unlock() }
func (m *model) commit(i int, end pglogrepl.LSN) {
	m.mu.Lock()
	m.committed[i], m.ends[i] = true, end
	m.mu.Unlock()
}

func (m *model) position() pglogrepl.LSN {
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.prefix < len(m.remaining) && m.committed[m.prefix] && m.remaining[m.prefix] == 0 {
		m.prefix++
	}
	if m.prefix == 0 {
		return m.start
	}
	return m.ends[m.prefix-1]
}

// TestTrackerMatchesModel acks records in random order from one goroutine
// and compares Confirmed with the model after every operation.
func TestTrackerMatchesModel(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x0b0cd))
			const start = 1000
			tr := checkpoint.New(start)
			m := &model{start: start}
			type rec struct {
				x *checkpoint.Txn
				i int
			}
			var unacked []rec
			end := pglogrepl.LSN(start)
			check := func(what string) {
				t.Helper()
				if got, want := tr.Confirmed(), m.position(); got != want {
					t.Fatalf("after %s: Confirmed() = %s, model says %s", what, got, want)
				}
			}
			ackSome := func() {
				for k := rng.IntN(4); k > 0 && len(unacked) > 0; k-- {
					j := rng.IntN(len(unacked))
					r := unacked[j]
					unacked[j] = unacked[len(unacked)-1]
					unacked = unacked[:len(unacked)-1]
					m.ack(r.i)
					r.x.Ack()
					check(fmt.Sprintf("ack of a record of tx %d", r.i))
				}
			}
			for range 300 {
				i := m.begin()
				x := tr.Begin()
				for range rng.IntN(5) { // 0 to 4 records
					m.add(i)
					x.Add()
					unacked = append(unacked, rec{x, i})
					ackSome() // acks may arrive before the commit
				}
				end += pglogrepl.LSN(1 + rng.IntN(100))
				m.commit(i, end)
				x.Commit(end)
				check(fmt.Sprintf("commit of tx %d", i))
				ackSome()
			}
			rng.Shuffle(len(unacked), func(a, b int) { unacked[a], unacked[b] = unacked[b], unacked[a] })
			for _, r := range unacked {
				m.ack(r.i)
				r.x.Ack()
				check(fmt.Sprintf("ack of a record of tx %d", r.i))
			}
			if got := tr.Confirmed(); got != end {
				t.Fatalf("Confirmed() = %s at the end, want the last end pglogrepl.LSN %s", got, end)
			}
			if tr.Pending() != 0 || tr.InFlight() != 0 {
				t.Fatalf("Pending %d, InFlight %d at the end", tr.Pending(), tr.InFlight())
			}
		})
	}
}

// TestTrackerConcurrentAcks has one goroutine begin, add and commit while
// several others ack in random order, and a reader check that Confirmed never
// passes the model's contiguous position, never goes back, and is always a
// transaction end. Run it with -race.
func TestTrackerConcurrentAcks(t *testing.T) {
	const (
		start   = 1000
		txCount = 2000
		ackers  = 4
	)
	tr := checkpoint.New(start)
	m := &model{start: start}
	type rec struct {
		x *checkpoint.Txn
		i int
	}
	records := make(chan rec, 64)
	var (
		ends    sync.Map // pglogrepl.LSN -> true
		lastEnd atomic.Uint64
		stop    = make(chan struct{})
		errs    = make(chan error, ackers+2)
		wg      sync.WaitGroup
	)
	ends.Store(pglogrepl.LSN(start), true)

	// Producer: commit order, like the relay.
	wg.Go(func() {
		defer close(records)
		rng := rand.New(rand.NewPCG(1, 2))
		end := pglogrepl.LSN(start)
		for range txCount {
			i := m.begin()
			x := tr.Begin()
			for range rng.IntN(6) {
				m.add(i)
				x.Add()
				records <- rec{x, i}
			}
			end += pglogrepl.LSN(1 + rng.IntN(50))
			ends.Store(end, true)
			m.commit(i, end) // the model learns first: it must stay an upper bound
			x.Commit(end)
		}
		lastEnd.Store(uint64(end))
	})
	// Ackers: each holds back a few records and acks them in random order.
	for a := range ackers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(a), 3))
			var held []rec
			ackOne := func() {
				j := rng.IntN(len(held))
				r := held[j]
				held[j] = held[len(held)-1]
				held = held[:len(held)-1]
				m.ack(r.i) // before the tracker hears of it
				r.x.Ack()
			}
			for r := range records {
				held = append(held, r)
				for len(held) > rng.IntN(16) {
					ackOne()
				}
			}
			for len(held) > 0 {
				ackOne()
			}
		})
	}
	// Reader: what a standby status update would see.
	var readerWG sync.WaitGroup
	readerWG.Go(func() {
		prev := pglogrepl.LSN(start)
		for {
			select {
			case <-stop:
				return
			default:
			}
			got := tr.Confirmed()
			upper := m.position() // read after: the model only moves forward
			switch _, isEnd := ends.Load(got); {
			case got > upper:
				errs <- fmt.Errorf("Confirmed() = %s passed the contiguous acked position %s", got, upper)
				return
			case got < prev:
				errs <- fmt.Errorf("Confirmed() went back from %s to %s", prev, got)
				return
			case !isEnd:
				errs <- fmt.Errorf("Confirmed() = %s is no transaction's end pglogrepl.LSN", got)
				return
			}
			prev = got
		}
	})
	wg.Wait()
	close(stop)
	readerWG.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got, want := tr.Confirmed(), pglogrepl.LSN(lastEnd.Load()); got != want {
		t.Errorf("Confirmed() = %s after every ack, want the last end pglogrepl.LSN %s", got, want)
	}
	if tr.Pending() != 0 || tr.InFlight() != 0 {
		t.Errorf("Pending %d, InFlight %d at the end", tr.Pending(), tr.InFlight())
	}
	if err := tr.WaitAcked(context.Background()); err != nil {
		t.Error(err)
	}
}

// BenchmarkAddAck measures the per-record cost inside one open transaction.
func BenchmarkAddAck(b *testing.B) {
	tr := checkpoint.New(0)
	x := tr.Begin()
	b.ReportAllocs()
	for b.Loop() {
		x.Add()
		x.Ack()
	}
}

// BenchmarkTransaction measures a one-record transaction end to end.
func BenchmarkTransaction(b *testing.B) {
	tr := checkpoint.New(0)
	var end pglogrepl.LSN
	b.ReportAllocs()
	for b.Loop() {
		end++
		x := tr.Begin()
		x.Add()
		x.Commit(end)
		x.Ack()
	}
}

// BenchmarkAddAckBatch adds 100 records, commits, then acks them.
func BenchmarkAddAckBatch(b *testing.B) {
	tr := checkpoint.New(0)
	var end pglogrepl.LSN
	b.ReportAllocs()
	for b.Loop() {
		end++
		x := tr.Begin()
		for range 100 {
			x.Add()
		}
		x.Commit(end)
		for range 100 {
			x.Ack()
		}
	}
}

// BenchmarkAckParallel acks from many goroutines at once, as producer
// callbacks do; each goroutine has its own open transaction.
func BenchmarkAckParallel(b *testing.B) {
	tr := checkpoint.New(0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		x := tr.Begin()
		for pb.Next() {
			x.Add()
			x.Ack()
		}
	})
}

// BenchmarkTransactionParallel runs one-record transactions from many
// goroutines; the single tracker lock is the contention point.
func BenchmarkTransactionParallel(b *testing.B) {
	tr := checkpoint.New(0)
	var end atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			x := tr.Begin()
			x.Add()
			x.Commit(pglogrepl.LSN(end.Add(1)))
			x.Ack()
		}
	})
}

// TestWaiting checks what the stall watchdog reads: the time since the
// oldest unconfirmed transaction had all its records handed over, while
// later transactions are acknowledged; zero while it is still open and once
// it is confirmed.
func TestWaiting(t *testing.T) {
	tr := checkpoint.New(0)
	a := tr.Begin()
	a.Add()
	if w := tr.Waiting(); !w.IsZero() {
		t.Fatalf("Waiting = %v while the oldest transaction is still open, want zero", w)
	}
	before := time.Now()
	a.Commit(10)
	b := tr.Begin()
	b.Add()
	b.Commit(20)
	b.Ack() // a later transaction acknowledged: a still waits
	if w := tr.Waiting(); w.Before(before) {
		t.Fatalf("Waiting = %v, want the time a was committed (after %v)", w, before)
	}
	a.Ack()
	if w := tr.Waiting(); !w.IsZero() || tr.Confirmed() != 20 {
		t.Fatalf("Waiting = %v, confirmed %v after every ack, want zero and 20", w, tr.Confirmed())
	}

	// A transaction handed over long before it became the oldest (a full
	// buffer draining) is timed from when it became the oldest.
	c, e := tr.Begin(), tr.Begin()
	c.Add()
	e.Add()
	c.Commit(30)
	e.Commit(40)
	time.Sleep(20 * time.Millisecond)
	acked := time.Now()
	c.Ack()
	if w := tr.Waiting(); w.Before(acked) {
		t.Fatalf("Waiting = %v, want the time e became the oldest (after %v), not when it was handed over", w, acked)
	}
}

// WaitRoom holds the reader while the cap of unconfirmed transactions is
// reached, as it is behind a transaction whose partition does not move, and
// lets it go once that transaction is confirmed.
func TestWaitRoom(t *testing.T) {
	tr := checkpoint.New(0)
	stuck := tr.Begin()
	stuck.Add()
	stuck.Commit(10)
	for i := range 3 { // acknowledged (or empty) transactions behind it
		if err := tr.WaitRoom(context.Background(), 4); err != nil {
			t.Fatal(err)
		}
		x := tr.Begin()
		x.Commit(pglogrepl.LSN(20 + i))
	}
	if got := tr.Pending(); got != 4 {
		t.Fatalf("Pending() = %d, want 4", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := tr.WaitRoom(ctx, 4); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitRoom at the cap: %v, want it to wait until its context ends", err)
	}
	done := make(chan error, 1)
	go func() { done <- tr.WaitRoom(context.Background(), 4) }()
	select {
	case err := <-done:
		t.Fatalf("WaitRoom returned %v at the cap", err)
	case <-time.After(20 * time.Millisecond):
	}
	stuck.Ack()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitRoom still waiting after the stuck transaction was acknowledged")
	}
	if got := tr.Confirmed(); got != 22 {
		t.Fatalf("Confirmed() = %d, want 22", got)
	}
}
