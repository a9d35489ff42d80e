package test

import (
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// event is one outbox row a writer tried to commit.
type event struct {
	ID        string
	Type      string // aggregate_type
	Key       string // aggregate_id
	EventType string
	Seq       int    // per (Type, Key), increasing in commit order
	Payload   string // in jsonb's canonical text form, so payload::text equals it
	Topic     string // the topic, when not Type + "-events" (the default topic template)
}

func (e event) topic() string {
	if e.Topic != "" {
		return e.Topic
	}
	return e.Type + "-events"
}

// ledger records what the writers committed and what they rolled back.
type ledger struct {
	mu         sync.Mutex
	committed  map[string]event
	rolledBack map[string]event
	maybe      map[string]event // COMMIT failed with an unknown outcome (spec.Tolerant)
}

func newLedger() *ledger {
	return &ledger{committed: map[string]event{}, rolledBack: map[string]event{}, maybe: map[string]event{}}
}

func (l *ledger) add(committed bool, evs ...event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range evs {
		if committed {
			l.committed[e.ID] = e
		} else {
			l.rolledBack[e.ID] = e
		}
	}
}

func (l *ledger) addMaybe(evs ...event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range evs {
		l.maybe[e.ID] = e
	}
}

func (l *ledger) committedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.committed)
}

// topics returns every topic an event (committed or not) would go to.
func (l *ledger) topics() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := map[string]bool{}
	var out []string
	for _, m := range []map[string]event{l.committed, l.rolledBack} {
		for _, e := range m {
			if !seen[e.topic()] {
				seen[e.topic()] = true
				out = append(out, e.topic())
			}
		}
	}
	return out
}

// loadSpec describes a write load. Keys are split between writers, so each
// key's commit order is its writer's order.
type loadSpec struct {
	Prefix       string // makes topics unique to the test
	Types, IDs   int
	Writers      int
	Events       int   // committed-or-not events to write in total
	TxSizes      []int // rows per transaction, cycled
	RollbackPct  int   // transactions rolled back, in percent
	SavepointPct int   // committed transactions with a rolled-back savepoint
	DeletePct    int   // rows deleted again in their own transaction
	PayloadBytes int   // approximate payload size (0: small)
	// Truth also inserts each kept event's id into outbox_truth in the same
	// transaction, so that the fate of a transaction whose COMMIT failed can
	// be read back afterwards (the table must exist).
	Truth bool
	// Tolerant writers keep going after an error: the transaction's events
	// are recorded as maybe committed (resolve them with outbox_truth).
	Tolerant bool
	// Pace is a pause after each transaction of each writer (0: none).
	Pace time.Duration
}

func uuid() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// writer state: the next sequence number of each key it owns.
type writer struct {
	spec loadSpec
	id   int
	rng  *mrand.Rand
	seq  map[[2]int]int
	pad  string
}

func (w *writer) next() event {
	var ti, ki int
	for {
		ti, ki = w.rng.IntN(w.spec.Types), w.rng.IntN(w.spec.IDs)
		if (ti*w.spec.IDs+ki)%w.spec.Writers == w.id {
			break
		}
	}
	k := [2]int{ti, ki}
	w.seq[k]++
	e := event{
		ID:        uuid(),
		Type:      fmt.Sprintf("%s_t%02d", w.spec.Prefix, ti),
		Key:       fmt.Sprintf("agg-%03d", ki),
		EventType: "Happened",
		Seq:       w.seq[k],
	}
	// jsonb orders keys by length, then bytewise, and prints ", " and ": ".
	e.Payload = fmt.Sprintf(`{"k": "%s", "pad": "%s", "seq": %d}`, e.Key, w.pad, e.Seq)
	return e
}

const insertSQL = `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4, $5)`

// runLoad writes spec.Events events and records the outcome in l.
func runLoad(ctx context.Context, d *db, spec loadSpec, l *ledger) error {
	per := spec.Events / spec.Writers
	errs := make(chan error, spec.Writers)
	var wg sync.WaitGroup
	for i := range spec.Writers {
		w := &writer{spec: spec, id: i, rng: mrand.New(mrand.NewPCG(uint64(i), 42)), seq: map[[2]int]int{}}
		if spec.PayloadBytes > 40 {
			w.pad = string(make([]byte, 0)) + fmt.Sprintf("%0*d", spec.PayloadBytes-40, 0)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- w.run(ctx, d, per, l)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (w *writer) run(ctx context.Context, d *db, n int, l *ledger) error {
	for done, tx := 0, 0; done < n && ctx.Err() == nil; tx++ {
		size := min(w.spec.TxSizes[tx%len(w.spec.TxSizes)], n-done)
		rollback := w.rng.IntN(100) < w.spec.RollbackPct
		savepoint := !rollback && w.rng.IntN(100) < w.spec.SavepointPct
		var kept, dropped []event
		b := &pgx.Batch{}
		for range size {
			e := w.next()
			b.Queue(insertSQL, e.ID, e.Type, e.Key, e.EventType, e.Payload)
			if w.spec.Truth {
				b.Queue(`INSERT INTO outbox_truth (id) VALUES ($1)`, e.ID)
			}
			if w.rng.IntN(100) < w.spec.DeletePct {
				b.Queue(`DELETE FROM outbox WHERE id = $1`, e.ID)
			}
			kept = append(kept, e)
		}
		if savepoint {
			b.Queue(`SAVEPOINT sp`)
			for range 1 + w.rng.IntN(3) {
				e := w.next()
				b.Queue(insertSQL, e.ID, e.Type, e.Key, e.EventType, e.Payload)
				dropped = append(dropped, e)
			}
			b.Queue(`ROLLBACK TO SAVEPOINT sp`)
		}
		err := runBatch(ctx, d, b, rollback)
		switch {
		case err == errRollback:
			l.add(false, kept...)
		case err != nil && w.spec.Tolerant && ctx.Err() == nil:
			// Unknown outcome; it does not count towards n, so that an
			// outage does not use up the load before the server is back.
			l.addMaybe(kept...)
			l.add(false, dropped...)
			time.Sleep(50 * time.Millisecond)
			continue
		case err != nil:
			// The outcome of a failed COMMIT is unknown; the tests that
			// inject faults into Postgres handle that themselves.
			return fmt.Errorf("writer %d: %w", w.id, err)
		default:
			l.add(true, kept...)
		}
		l.add(false, dropped...)
		done += size
		if w.spec.Pace > 0 {
			time.Sleep(w.spec.Pace)
		}
	}
	return nil
}

var errRollback = fmt.Errorf("rolled back on purpose")

// runBatch runs b in one transaction, and rolls it back with errRollback
// when rollback is set.
func runBatch(ctx context.Context, d *db, b *pgx.Batch, rollback bool) error {
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if rollback {
			return errRollback
		}
		return nil
	})
}
