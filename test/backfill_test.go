package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"golang.org/x/sync/errgroup"
)

// backfillConfig is pollingConfig's router with a backfill of the rows a
// polling relay left PENDING or PROCESSING, in created_at order.
func backfillConfig(batch, rate int) string {
	return backfillConfigOf("status IN ('PENDING','PROCESSING')", "created_at", batch, rate)
}

// backfillConfigOf is backfillConfig with another condition and order.
func backfillConfigOf(where, order string, batch, rate int) string {
	return fmt.Sprintf(`postgres:
  table: public.relay_outbox
  backfill:
    where: %q
    order_by: %s
    batch: %d
    rate: %d
router:
  topic_column: topic
  route_by_column: topic
  key_column: partition_key
  event_type_column: event_type
`, where, order, batch, rate)
}

// backfillSetup is a polling relay's table holding pending rows before
// outboxd first starts.
type backfillSetup struct {
	d     *db
	l     *ledger
	topic string
	keys  []string
	seq   map[string]int
}

// newBackfillSetup makes relay_outbox with n PENDING rows (every tenth
// PROCESSING) over keys keys, in the ledger, and 500 SENT rows that are
// not (a backfill that sent them would show them as phantoms).
func newBackfillSetup(t *testing.T, n, keys int) *backfillSetup {
	t.Helper()
	d := newDB(t)
	d.exec(t, pollingTable)
	s := &backfillSetup{d: d, l: newLedger(), topic: d.name + "-orders", seq: map[string]int{}}
	if _, err := kadm.NewClient(kafkaClient(t)).CreateTopic(context.Background(), 6, 1, nil, s.topic); err != nil {
		t.Fatal(err)
	}
	for range keys {
		s.keys = append(s.keys, uuid())
	}
	ctx := context.Background()
	const chunk = 5000
	for from := 0; from < n; from += chunk {
		var ids, ks, payloads, statuses []string
		var evs []event
		for i := from; i < min(from+chunk, n); i++ {
			key := s.keys[i%keys]
			s.seq[key]++
			e := event{ID: uuid(), Type: d.name, Key: key, EventType: "Happened", Seq: s.seq[key], Topic: s.topic,
				Payload: fmt.Sprintf(`{"seq": %d, "seeded": %d}`, s.seq[key], i)}
			status := "PENDING"
			if i%10 == 0 {
				status = "PROCESSING"
			}
			ids, ks, payloads, statuses = append(ids, e.ID), append(ks, key), append(payloads, e.Payload), append(statuses, status)
			evs = append(evs, e)
		}
		// created_at one microsecond apart in the insert order: each key's
		// rows are in its seq order, with no ties.
		if _, err := d.pool.Exec(ctx, `INSERT INTO public.relay_outbox (id, topic, partition_key, event_type, payload, status, created_at)
			SELECT id::uuid, $5, key::uuid, 'Happened', payload::jsonb, status, timestamptz '2026-01-01' + (($6 + ord) * interval '1 microsecond')
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS u(id, key, payload, status, ord) ORDER BY ord`,
			ids, ks, payloads, statuses, s.topic, from); err != nil {
			t.Fatal(err)
		}
		s.l.add(true, evs...)
	}
	d.exec(t, `INSERT INTO public.relay_outbox (id, topic, partition_key, event_type, payload, status, published_at)
		SELECT gen_random_uuid(), $1, gen_random_uuid(), 'Happened', '{}', 'SENT', now() FROM generate_series(1, 500)`, s.topic)
	return s
}

// write inserts events of the setup's keys until stop is closed, with
// writers writers each owning its share of the keys: each key's commit
// order is its seq order, before, during and after outboxd's start.
func (s *backfillSetup) write(ctx context.Context, stop <-chan struct{}, writers int) error {
	g, ctx := errgroup.WithContext(ctx)
	for w := range writers {
		var mine []string
		next := map[string]int{}
		for i, k := range s.keys {
			if i%writers == w {
				mine = append(mine, k)
				next[k] = s.seq[k] + 1
			}
		}
		g.Go(func() error {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return nil
				default:
				}
				key := mine[i%len(mine)]
				e := event{ID: uuid(), Type: s.d.name, Key: key, EventType: "Happened", Seq: next[key], Topic: s.topic,
					Payload: fmt.Sprintf(`{"seq": %d, "writer": %d}`, next[key], w)}
				next[key]++
				if _, err := s.d.pool.Exec(ctx, `INSERT INTO public.relay_outbox (id, topic, partition_key, event_type, payload) VALUES ($1, $2, $3, $4, $5)`,
					e.ID, e.Topic, e.Key, e.EventType, e.Payload); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("writer %d: %w", w, err)
				}
				s.l.add(true, e)
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	return g.Wait()
}

// progress reads the backfill's phase and the rows it recorded sent.
func (s *backfillSetup) progress(t *testing.T) (phase string, sent, total int64) {
	t.Helper()
	var made bool
	if err := s.d.pool.QueryRow(context.Background(), `SELECT to_regclass('public.outboxd_backfill') IS NOT NULL`).Scan(&made); err != nil || !made {
		return "", 0, 0 // not yet made by outboxd's start
	}
	err := s.d.pool.QueryRow(context.Background(), `SELECT state->>'phase', (state->>'sent')::bigint, (state->>'total')::bigint
		FROM public.outboxd_backfill WHERE slot = $1`, s.d.slot).Scan(&phase, &sent, &total)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return phase, sent, total
}

// Rows a polling relay left PENDING or PROCESSING are in the table, and
// writers go on inserting while outboxd starts with a backfill: every row
// pending when the slot was created is backfilled, every later one
// streamed, each once (no kill: no duplicate), none lost, no SENT row sent,
// and each key's events in order across the switch.
func TestBackfillWithWritersRunning(t *testing.T) {
	s := newBackfillSetup(t, 5000, 60)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- s.write(ctx, stop, 3) }()
	p := start(t, s.d.env(), "-config", writeConfig(t, backfillConfig(200, 0)))
	p.waitStreaming()
	line := p.waitLog(`msg="backfill done[^"]*"[^\n]*`, time.Second)
	t.Log(line)
	time.Sleep(1500 * time.Millisecond) // the writers go on; outboxd streams
	close(stop)
	r := verifyLoad(t, s.l, done)
	if r.Duplicates != 0 {
		t.Errorf("%d duplicates; a backfill with no kill sends each row once", r.Duplicates)
	}
	if phase, sent, total := s.progress(t); phase != "done" || sent != total || total < 5000 {
		t.Errorf("backfill state: phase %s, %d of %d rows sent; want done, all, at least the 5000 seeded", phase, sent, total)
	}
	var left bool
	if err := s.d.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'outboxd\_backfill\_%')`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left {
		t.Error("the backfill's key table is still there after it finished")
	}
}

// A backfill of 100,000 pending rows, with writers running, SIGKILLed three
// times during it: each resumed run starts after the last page Kafka
// acknowledged. Nothing is lost, each key keeps its order, and the repeats
// are at most the pages in flight at each kill. Rows deleted or flipped to
// SENT after the slot's snapshot, before their page, are still sent.
func TestBackfillSurvivesKills(t *testing.T) {
	const rows, batch, kills = 100000, 100, 3 // issue 35: 100,000 pending rows, three SIGKILLs
	s := newBackfillSetup(t, rows, 200)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- s.write(ctx, stop, 3) }()
	// The pages in flight are at most kafka.max_buffered_records rows.
	const inFlight = 4 * batch
	cfg := writeConfig(t, backfillConfig(batch, 20000)+fmt.Sprintf("kafka:\n  max_buffered_records: %d\n", inFlight))
	var at int64
	for k := range kills {
		p := start(t, s.d.env(), "-config", cfg)
		// Killed once it recorded a fifth more of the rows.
		at = s.waitRecorded(t, int64(k+1)*rows/5, fmt.Sprintf("kill %d", k+1))
		if k == 0 { // progress shows in /status and the metrics while it runs
			showsProgress(t, p)
		}
		if code := p.stop(syscall.SIGKILL, 10*time.Second); code != -1 {
			t.Logf("kill %d: exit code %d", k+1, code)
		}
		t.Logf("kill %d at %d rows recorded", k+1, at)
		if k == 0 {
			s.cleanUp(t)
		}
	}
	p := start(t, s.d.env(), "-config", cfg)
	p.waitStreaming()
	t.Log(p.waitLog(`msg="backfill started"[^\n]*`, time.Second))
	time.Sleep(time.Second)
	close(stop)
	r := verifyLoad(t, s.l, done)
	if r.Duplicates > kills*inFlight {
		t.Errorf("%d duplicates; want at most the %d rows of the pages in flight at the %d kills", r.Duplicates, kills*inFlight, kills)
	}
	if phase, sent, total := s.progress(t); phase != "done" || sent != total {
		t.Errorf("backfill state: phase %s, %d of %d rows sent; want done, all", phase, sent, total)
	}
}

// The start-up's two refusals and its recovery: a slot that exists without
// a backfill is refused (what it streamed cannot be told apart from what
// is pending), and a slot a backfill created before a kill left its rows
// unfixed (phase snapshot) is dropped and made again, so that the pending
// rows are all delivered.
func TestBackfillStartUp(t *testing.T) {
	t.Run("slot without backfill refused", func(t *testing.T) {
		s := newBackfillSetup(t, 100, 5)
		s.d.exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, s.d.slot)
		p := start(t, s.d.env(), "-config", writeConfig(t, backfillConfig(100, 0)))
		if code := p.waitExit(30 * time.Second); code == 0 {
			t.Fatal("outboxd exited 0 with a backfill on a slot it did not make")
		}
		p.waitLog(`exists and was not made by a backfill`, time.Second)
	})
	for _, tt := range []struct {
		name, where, order, log string
		slotMade                bool // the failure comes after the slot was made
	}{
		{"a condition Postgres refuses", "nosuch = 1", "created_at", `postgres.backfill.where \W+nosuch = 1\W+ is refused by Postgres`, false},
		{"an order column with NULLs", "status = 'PENDING'", "published_at", `postgres.backfill.order_by published_at: \d+ of the \d+ rows to backfill have no value`, true},
	} {
		t.Run(tt.name+" leaves no slot", func(t *testing.T) {
			s := newBackfillSetup(t, 100, 5)
			// The key table an earlier attempt committed before a kill.
			keys := "public." + s.keyTable()
			s.d.exec(t, `CREATE TABLE `+keys+` AS SELECT * FROM public.relay_outbox`)
			p := start(t, s.d.env(), "-config", writeConfig(t, backfillConfigOf(tt.where, tt.order, 100, 0)))
			if code := p.waitExit(30 * time.Second); code == 0 {
				t.Fatal("outboxd exited 0")
			}
			p.waitLog(tt.log, time.Second)
			var slots int
			if err := s.d.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, s.d.slot).Scan(&slots); err != nil {
				t.Fatal(err)
			}
			if slots != 0 {
				t.Error("the backfill's failure left its replication slot behind")
			}
			// Once it made the slot, a failure clears the key table too,
			// which would otherwise hold a copy of the rows nothing points
			// at (review-bf36 R4).
			var left bool
			if err := s.d.pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, keys).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if tt.slotMade && left {
				t.Errorf("the backfill's failure left its key table %s behind", keys)
			}
		})
	}
	t.Run("killed before phase sending was saved", func(t *testing.T) {
		s := newBackfillSetup(t, 2000, 20)
		// What a kill between the commit of the key table and the save of
		// phase sending leaves: the state of phase snapshot, the slot, and
		// the committed key table (a kill before the commit leaves no key
		// table). The key table holds a row the outbox table never had: a
		// start that sent the old copy would show it as a phantom, and the
		// rows of both copies twice (review-bf36 R8).
		s.d.exec(t, `CREATE TABLE public.outboxd_backfill (slot text PRIMARY KEY, state jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())`)
		s.d.exec(t, `INSERT INTO public.outboxd_backfill (slot, state) SELECT $1, jsonb_build_object('slot', $1::text, 'phase', 'snapshot', 'lsn', lsn::text)
			FROM pg_create_logical_replication_slot($1, 'pgoutput')`, s.d.slot)
		keys := "public." + s.keyTable()
		s.d.exec(t, `CREATE TABLE `+keys+` AS SELECT * FROM public.relay_outbox WHERE status IN ('PENDING','PROCESSING');
			INSERT INTO `+keys+` (id, topic, partition_key, event_type, payload, status, created_at, retry_count)
				VALUES (gen_random_uuid(), '`+s.topic+`', gen_random_uuid(), 'Happened', '{"phantom": true}', 'PENDING', '2025-01-01', 0)`)
		s.d.exec(t, `UPDATE public.relay_outbox SET retry_count = retry_count + 1 WHERE status = 'PROCESSING'`) // after the old slot: not streamed by it
		p := start(t, s.d.env(), "-config", writeConfig(t, backfillConfig(100, 0)))
		p.waitStreaming()
		p.waitLog(`dropped the replication slot a backfill created`, time.Second)
		done := make(chan error, 1)
		done <- nil
		if r := verifyLoad(t, s.l, done); r.Duplicates != 0 {
			t.Errorf("%d duplicates; want none", r.Duplicates)
		}
	})
}

// The cut-over from a running polling relay with a backfill, as
// docs/migrating-from-polling.md gives it, with writers that never pause:
// the relay runs under load and stops between a produce and its mark;
// outboxd starts with postgres.backfill. Nothing is lost or phantom, each
// key keeps its order, and the only repeats are the rows the relay sent and
// never marked.
func TestPollingRelayCutOverWithBackfill(t *testing.T) {
	d := newDB(t)
	d.exec(t, pollingTable)
	l := newLedger()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	relay, _, stop, done := pollingRelayCrashed(ctx, t, d, l)
	p := start(t, d.env(), "-config", writeConfig(t, backfillConfig(200, 0)))
	p.waitStreaming()
	t.Log(p.waitLog(`msg="backfill done[^"]*"[^\n]*`, time.Second))
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	r := verifyLoad(t, l, done)
	t.Logf("the relay sent %d records, the last %d of them unmarked", relay.sent.Load(), relay.unmarked)
	if r.Duplicates != relay.unmarked {
		t.Errorf("%d duplicates; want the %d rows the relay sent and never marked, sent again", r.Duplicates, relay.unmarked)
	}
}

// A backfill killed half-way, then outboxd started without
// postgres.backfill: it refuses, since streaming the slot would confirm it
// past the rows not yet sent. With the setting back it finishes, and
// nothing is lost; each key's rows go out in created_at order, order_by's
// default.
func TestBackfillUnfinishedIsNotPassedOver(t *testing.T) {
	s := newBackfillSetup(t, 3000, 30)
	// No order_by: created_at by default, not the random UUID key.
	cfg := writeConfig(t, strings.Replace(backfillConfig(100, 1000), "    order_by: created_at\n", "", 1))
	p := start(t, s.d.env(), "-config", cfg)
	deadline := time.Now().Add(60 * time.Second)
	for {
		phase, sent, _ := s.progress(t)
		if phase == "done" {
			t.Fatal("the backfill finished before the kill; lower postgres.backfill.rate")
		}
		if phase == "sending" && sent > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the backfill sent nothing in 60 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.stop(syscall.SIGKILL, 10*time.Second)
	expectStartupError(t, s.d.env(), `postgres.backfill is not set, but the backfill of slot \\?"`+s.d.slot+`\\?" recorded in public.outboxd_backfill is not done \(phase sending, \d+ of 3000 rows sent\)`,
		"-config", writeConfig(t, pollingConfig))
	p = start(t, s.d.env(), "-config", cfg)
	p.waitStreaming()
	done := make(chan error, 1)
	done <- nil
	verifyLoad(t, s.l, done)
}
