package test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"
)

// outboxShape is an outbox table of a test, with how to write to it.
type outboxShape struct {
	table  string
	create string // "" for the table newDB makes
	router string // the entry's router overrides, YAML flow mapping
	insert string // $1 id, $2 route-by value, $3 key, $4 event type, $5 payload
	del    string // $1 id: insert-then-delete
	key    func(i int) string
	topic  func(typ string) string
	// message is e as a logical message's content that names the table,
	// with its fields named like the table's columns (tables 1 and 2).
	message func(e event) string
}

// The three outbox tables of TestSeveralTablesOnOneSlot, each of its own
// shape: column names, key type, payload type and topic template differ.
// The first is outboxd's own table (newDB makes it).
var severalShapes = []outboxShape{
	{table: "public.outbox",
		insert: `INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4, $5)`,
		del:    `DELETE FROM public.outbox WHERE id = $1`,
		key:    func(i int) string { return fmt.Sprintf("agg-%03d", i) },
		topic:  func(typ string) string { return typ + "-events" }},
	{table: "orders.events",
		create: `CREATE SCHEMA orders; CREATE TABLE orders.events (event_id uuid PRIMARY KEY, stream text NOT NULL, stream_no bigint NOT NULL,
			kind text NOT NULL, body jsonb NOT NULL, at timestamptz NOT NULL DEFAULT now())`,
		router: `{id_column: event_id, route_by_column: stream, key_column: stream_no, event_type_column: kind, payload_column: body, topic_template: 'orders.${routedByValue}'}`,
		insert: `INSERT INTO orders.events (event_id, stream, stream_no, kind, body) VALUES ($1, $2, $3::bigint, $4, $5)`,
		del:    `DELETE FROM orders.events WHERE event_id = $1`,
		key:    func(i int) string { return fmt.Sprint(1000 + i) },
		topic:  func(typ string) string { return "orders." + typ },
		message: func(e event) string {
			return fmt.Sprintf(`{"__outbox_table": "orders.events", "event_id": %q, "stream": %q, "stream_no": %s, "kind": %q, "body": %s}`,
				e.ID, e.Type, e.Key, e.EventType, e.Payload)
		}},
	{table: "wallet.outbox_events",
		create: `CREATE SCHEMA wallet; CREATE TABLE wallet.outbox_events (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, uid text NOT NULL UNIQUE,
			destination text NOT NULL, partition_key uuid NOT NULL, type text NOT NULL, data text NOT NULL)`,
		router: `{id_column: uid, route_by_column: destination, key_column: partition_key, event_type_column: type, payload_column: data, topic_template: '${routedByValue}'}`,
		insert: `INSERT INTO wallet.outbox_events (uid, destination, partition_key, type, data) VALUES ($1, $2, $3::uuid, $4, $5)`,
		del:    `DELETE FROM wallet.outbox_events WHERE uid = $1`,
		key:    func(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) },
		topic:  func(typ string) string { return typ },
		message: func(e event) string {
			return fmt.Sprintf(`{"__outbox_table": "wallet.outbox_events", "uid": %q, "destination": %q, "partition_key": %q, "type": %q, "data": %q}`,
				e.ID, e.Type, e.Key, e.EventType, e.Payload)
		}},
}

// severalTypes is the number of route-by values of each table's events.
const severalTypes = 3

// severalTablesConfig writes the configuration of the three tables.
func severalTablesConfig(t *testing.T) string {
	t.Helper()
	return tablesConfig(t, severalShapes)
}

// tablesConfig writes the configuration of postgres.tables over shapes, in
// their order.
func tablesConfig(t *testing.T, shapes []outboxShape) string {
	t.Helper()
	yaml := "postgres:\n  tables:\n"
	for _, s := range shapes {
		if s.router == "" {
			yaml += "    - " + s.table + "\n"
			continue
		}
		yaml += "    - name: " + s.table + "\n      router: " + s.router + "\n"
	}
	// A message must name its table when there are several.
	yaml += "router:\n  messages:\n    unowned: ignore\n"
	return writeConfig(t, yaml)
}

// writeConfig writes yaml to a file of its own and returns its path.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "outboxd.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Issue 35 §1: three outbox tables of different shapes on one slot and one
// publication, written to in mixed transactions, with outboxd SIGKILLed
// once: every committed event of every table arrives, routed by its own
// table's settings, in order per key; none that rolled back does.
func TestSeveralTablesOnOneSlot(t *testing.T) {
	d := newDB(t)
	l, loadDone, _ := severalTablesRun(t, d, d.env(), 1)
	r := verifyLoad(t, l, loadDone)
	if limit := 10000 + 2000; r.Duplicates > limit {
		t.Errorf("%d duplicates after one kill, more than the unacknowledged window allows (%d)", r.Duplicates, limit)
	}
}

// The same in exactly-once mode, SIGKILLed twice: a read_committed
// consumer sees every committed event once.
func TestSeveralTablesExactlyOnce(t *testing.T) {
	d := newDB(t)
	l, loadDone, p := severalTablesRun(t, d, eosEnv(d), 2)
	if err := <-loadDone; err != nil {
		t.Fatal(err)
	}
	p.waitLog(`exactly-once: resuming after the position committed in Kafka`, 30*time.Second)
	verifyExactlyOnce(t, d, severalShapes, l)
}

// verifyExactlyOnce checks that a read_committed consumer of the topics of
// severalTablesLoad over shapes sees every committed event of l once, in
// order per key, and nothing else.
func verifyExactlyOnce(t *testing.T, d *db, shapes []outboxShape, l *ledger) {
	t.Helper()
	var topics []string
	for si, s := range shapes {
		for ti := range severalTypes {
			topics = append(topics, s.topic(fmt.Sprintf("%s_s%d_t%d", d.name, si, ti)))
		}
	}
	c := collectCommitted(t, svc.brokers, topics)
	c.waitFor(t, l.committedIDs(), 2*time.Minute)
	time.Sleep(2 * time.Second) // for duplicates behind the last event
	r := check(l, c.records(), partitionsOf(t, topics...))
	t.Logf("%s", r)
	r.failOnLoss(t)
	noDuplicates(t, r)
}

// severalTablesRun makes the three tables in d, starts outboxd on them with
// env, starts the load, and SIGKILLs outboxd kills times while it runs,
// restarting it each time. It returns the load's ledger and outcome, and the
// last outboxd.
func severalTablesRun(t *testing.T, d *db, env []string, kills int) (*ledger, <-chan error, *proc) {
	t.Helper()
	for _, s := range severalShapes {
		if s.create != "" {
			d.exec(t, s.create)
		}
	}
	cfg := severalTablesConfig(t)
	p := start(t, env, "-config", cfg)
	p.waitStreaming()
	p.waitLog(`msg="created publication" publication=outboxd table=public.outbox,orders.events,wallet.outbox_events`, time.Second)

	l := newLedger()
	const writers, events = 2, 9000
	loadDone := make(chan error, 1)
	go func() { loadDone <- severalTablesLoad(context.Background(), d, severalShapes, writers, events, l) }()
	for i := range kills {
		waitCommitted(t, l, (i+1)*events/(kills+2))
		p.stop(syscall.SIGKILL, 10*time.Second)
		p = start(t, env, "-config", cfg)
		p.waitStreaming()
		t.Logf("kill %d at %d committed events", i+1, l.committedCount())
	}
	return l, loadDone, p
}

// severalTablesLoad writes events events over the tables of shapes from
// writers writers, in transactions of 1 to 30 rows that mix the tables, 5 %
// of them rolled back, a tenth of the rows deleted again in their
// transaction, and records the outcome in l. Each key belongs to
// one writer, so its commit order is that writer's.
func severalTablesLoad(ctx context.Context, d *db, shapes []outboxShape, writers, events int, l *ledger) error {
	const keys = 20
	var g errgroup.Group
	for w := range writers {
		g.Go(func() error {
			rng := mrand.New(mrand.NewPCG(uint64(w), 35))
			seq := map[[3]int]int{}
			for done := 0; done < events/writers && ctx.Err() == nil; {
				size := min(1+rng.IntN(30), events/writers-done)
				rollback := rng.IntN(100) < 5
				b := &pgx.Batch{}
				var evs []event
				for range size {
					si, ti := rng.IntN(len(shapes)), rng.IntN(severalTypes)
					ki := w + writers*rng.IntN(keys) // this writer's keys
					s := shapes[si]
					k := [3]int{si, ti, ki}
					seq[k]++
					typ := fmt.Sprintf("%s_s%d_t%d", d.name, si, ti)
					e := event{ID: uuid(), Type: typ, Key: s.key(ki), EventType: "Happened", Seq: seq[k], Topic: s.topic(typ)}
					if si == 2 {
						e.Payload = fmt.Sprintf(`{"seq":%d}`, e.Seq) // text: as written
					} else {
						e.Payload = fmt.Sprintf(`{"seq": %d}`, e.Seq) // jsonb's canonical text
					}
					if si > 0 && rng.IntN(4) == 0 {
						// A logical message, routed by the table it names.
						b.Queue(`SELECT pg_logical_emit_message(true, 'outbox', $1)`, s.message(e))
					} else {
						b.Queue(s.insert, e.ID, typ, e.Key, e.EventType, e.Payload)
						if rng.IntN(10) == 0 {
							b.Queue(s.del, e.ID) // insert-then-delete: delivered all the same
						}
					}
					evs = append(evs, e)
				}
				err := runBatch(ctx, d, b, rollback)
				switch {
				case err == errRollback:
					l.add(false, evs...)
				case err != nil:
					return fmt.Errorf("writer %d: %w", w, err)
				default:
					l.add(true, evs...)
				}
				done += size
			}
			return nil
		})
	}
	return g.Wait()
}

// With several outbox tables, outboxd owns the publication: a row of a
// table that the publication gained while outboxd ran, which no entry
// lists, stops outboxd with the table's name instead of being passed over,
// and the slot is not confirmed past it; at the next start the publication
// is refused. A table's failed start-up check names the table.
func TestSeveralTablesNoRowPassedOver(t *testing.T) {
	d := newDB(t)
	s := severalShapes[1]
	d.exec(t, s.create)
	d.exec(t, `CREATE TABLE public.other (id int PRIMARY KEY, v text)`)
	yaml := "postgres:\n  tables:\n    - public.outbox\n    - name: " + s.table + "\n      router: " + s.router + "\nrouter:\n  messages:\n    unowned: ignore\n"
	cfg := writeConfig(t, yaml)
	bad := writeConfig(t, strings.Replace(yaml, "key_column: stream_no", "key_column: nope", 1))
	env := d.env()
	expectStartupError(t, env, `outbox table orders.events has no column nope; add it or set the \*_column settings of postgres.tables\[1\].router`, "-config", bad)

	p := start(t, env, "-config", cfg)
	p.waitStreaming()
	typ := d.name + "_np"
	before := uuid()
	d.exec(t, s.insert, before, typ, "7", "Happened", `{}`)
	readUntil(t, []string{"orders." + typ}, 30*time.Second, 0, waitIDs(before))
	d.exec(t, `ALTER PUBLICATION outboxd ADD TABLE public.other`)
	lsn := currentLSN(t, d)
	d.exec(t, `INSERT INTO public.other VALUES (1, 'not an event')`)
	if code := p.waitExit(30 * time.Second); code == 0 {
		t.Fatalf("outboxd exited 0 after a row of a table it has no router for")
	}
	p.waitLog(`publication \\?"outboxd\\?" published a row of public.other \(relation \d+\), which is none of postgres.tables nor a partition of one: outboxd has no router for it and stopped rather than pass it over`, time.Second)
	t.Log(p.waitLog(`level=ERROR .*`, time.Second))
	p.waitLog(`if its rows are outbox events, list public.other under postgres.tables and restart`, time.Second)
	if c := d.confirmedFlush(t); c > lsn {
		t.Errorf("the slot was confirmed to %X, past the unrouted row (written after %X)", c, lsn)
	}
	expectStartupError(t, env, `publication \\?"outboxd\\?" also publishes public.other, which postgres.tables does not list`, "-config", cfg)
	d.exec(t, `CREATE PUBLICATION everything FOR ALL TABLES`)
	expectStartupError(t, append(env[:len(env):len(env)], "OUTBOXD_POSTGRES_PUBLICATION=everything"),
		`publication \\?"everything\\?" is FOR ALL TABLES, so it publishes tables postgres.tables does not list \(public.other\)`, "-config", cfg)
}

// The same for a row of a table dropped before outboxd read it: outboxd
// cannot tell whether it was a partition of an outbox table, so it stops
// with its name and where the row is. The advance its message gives skips
// that transaction only: an event committed after it is delivered.
func TestSeveralTablesHaltOnDroppedTable(t *testing.T) {
	d := newDB(t)
	s := severalShapes[1]
	d.exec(t, s.create)
	yaml := "postgres:\n  tables:\n    - public.outbox\n    - name: " + s.table + "\n      router: " + s.router + "\nrouter:\n  messages:\n    unowned: ignore\n"
	cfg := writeConfig(t, yaml)
	env := d.env()
	p := start(t, env, "-config", cfg)
	p.waitStreaming()
	p.stop(syscall.SIGTERM, 30*time.Second)

	d.exec(t, `CREATE TABLE public.gone (id int PRIMARY KEY)`)
	d.exec(t, `ALTER PUBLICATION outboxd ADD TABLE public.gone`)
	d.exec(t, `INSERT INTO public.gone VALUES (1)`)
	typ := d.name + "_gone"
	after := uuid() // committed after the unrouted row, before the DROP
	d.exec(t, s.insert, after, typ, "7", "Happened", `{}`)
	d.exec(t, `DROP TABLE public.gone`)

	p = start(t, env, "-config", cfg)
	if code := p.waitExit(60 * time.Second); code == 0 {
		t.Fatalf("outboxd exited 0 after a row of a dropped table")
	}
	p.waitLog(`published a row of public.gone \(relation \d+\), a table dropped since, which outboxd cannot tell for a partition of one of postgres.tables or another table: `+
		`outboxd has no router for it and stopped rather than pass it over \(the row at LSN [0-9A-F]+/[0-9A-F]+, xid \d+, in the transaction whose commit record is at [0-9A-F]+/[0-9A-F]+\)`, time.Second)
	m := regexp.MustCompile(`SELECT pg_replication_slot_advance\('([^']+)', '([0-9A-F]+/[0-9A-F]+)'::pg_lsn \+ 1\)`).FindStringSubmatch(p.logs.String())
	if m == nil || m[1] != d.slot {
		t.Fatalf("the error gives no slot advance past the transaction on slot %s; log:\n%s", d.slot, p.logs.String())
	}
	d.exec(t, `SELECT pg_replication_slot_advance($1, $2::pg_lsn + 1)`, d.slot, m[2])
	id := uuid()
	d.exec(t, s.insert, id, typ, "7", "Happened", `{}`)
	p = start(t, env, "-config", cfg)
	p.waitStreaming()
	readUntil(t, []string{"orders." + typ}, 30*time.Second, 0, waitIDs(after, id))
}

// outboxd replay with several tables replays the table -table names, routed
// by that entry's settings, and refuses to guess without -table.
func TestSeveralTablesReplay(t *testing.T) {
	d := newDB(t)
	for _, s := range severalShapes {
		if s.create != "" {
			d.exec(t, s.create)
		}
	}
	cfg := severalTablesConfig(t)
	s := severalShapes[2]
	typ := d.name + "_rp"
	var ids []string
	for i := range 5 {
		id := uuid()
		d.exec(t, s.insert, id, typ, s.key(i), "Happened", `{}`)
		ids = append(ids, id)
	}
	d.exec(t, severalShapes[1].insert, uuid(), typ, "7", "Happened", `{}`) // another table's: not replayed

	bad := start(t, d.env(), "replay", "-config", cfg, "-where", "true")
	if code := bad.waitExit(30 * time.Second); code != 1 {
		t.Fatalf("replay without -table exited %d, want 1", code)
	}
	bad.waitLog(`postgres.tables lists several tables \(public.outbox, orders.events, wallet.outbox_events\): name the one to replay with -table`, time.Second)

	rp := start(t, d.env(), "replay", "-config", cfg, "-table", s.table, "-where", "true")
	if code := rp.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("replay -table %s exited %d, want 0", s.table, code)
	}
	recs := readUntil(t, []string{s.topic(typ), severalShapes[1].topic(typ)}, 30*time.Second, time.Second, waitIDs(ids...))
	if len(recs) != len(ids) {
		t.Errorf("%d records, want the %d rows of %s", len(recs), len(ids), s.table)
	}
	for _, r := range recs {
		if header(r, "outboxd.replay") == "" || r.Topic != s.topic(typ) {
			t.Errorf("record %s on %s: replay header %q; want one on %s", header(r, "id"), r.Topic, header(r, "outboxd.replay"), s.topic(typ))
		}
	}
}

// outboxd migrate with several tables creates each, with the column names of
// its entry's router, so that outboxd then starts on them.
func TestSeveralTablesMigrate(t *testing.T) {
	d := newDB(t)
	d.exec(t, `CREATE SCHEMA billing`)
	yaml := "postgres:\n  tables:\n    - public.outbox\n    - name: billing.outbox\n      router: {id_column: event_id, key_column: account, payload_column: body}\n" +
		"router:\n  messages:\n    unowned: ignore\n"
	cfg := writeConfig(t, yaml)
	m := start(t, d.env(), "migrate", "-config", cfg)
	if code := m.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("outboxd migrate exited %d", code)
	}
	m.waitLog(`msg="outbox table ready" table=billing.outbox`, time.Second)
	p := start(t, d.env(), "-config", cfg)
	p.waitStreaming()
	typ := d.name + "_mig"
	id := uuid()
	d.exec(t, `INSERT INTO billing.outbox (event_id, aggregate_type, account, event_type, body) VALUES ($1, $2, 'acc-1', 'Billed', '{}')`, id, typ)
	readUntil(t, []string{typ + "-events"}, 30*time.Second, 0, waitIDs(id))
}
