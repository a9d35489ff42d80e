package test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/shard"
)

// The three outbox tables of TestShardsSeveralTables: each is keyed by a
// column of its own name and type (text, varchar(64), text COLLATE "C"),
// which its shard row filters hash. The first is outboxd's own table
// (newDB makes it).
var shardShapes = []outboxShape{
	severalShapes[0],
	{table: "orders.events",
		create: `CREATE SCHEMA orders; CREATE TABLE orders.events (event_id uuid PRIMARY KEY, stream text NOT NULL, stream_key varchar(64) NOT NULL,
			kind text NOT NULL, body jsonb NOT NULL)`,
		router: `{id_column: event_id, route_by_column: stream, key_column: stream_key, event_type_column: kind, payload_column: body, topic_template: 'orders.${routedByValue}'}`,
		insert: `INSERT INTO orders.events (event_id, stream, stream_key, kind, body) VALUES ($1, $2, $3, $4, $5)`,
		del:    `DELETE FROM orders.events WHERE event_id = $1`,
		key:    func(i int) string { return fmt.Sprintf("order-%d", 1000+i) },
		topic:  func(typ string) string { return "orders." + typ },
		message: func(e event) string {
			return fmt.Sprintf(`{"__outbox_table": "orders.events", "event_id": %q, "stream": %q, "stream_key": %q, "kind": %q, "body": %s}`,
				e.ID, e.Type, e.Key, e.EventType, e.Payload)
		}},
	{table: "wallet.outbox_events",
		create: `CREATE SCHEMA wallet; CREATE TABLE wallet.outbox_events (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, uid text NOT NULL UNIQUE,
			destination text NOT NULL, partition_key text COLLATE "C" NOT NULL, type text NOT NULL, data text NOT NULL)`,
		router: `{id_column: uid, route_by_column: destination, key_column: partition_key, event_type_column: type, payload_column: data, topic_template: '${routedByValue}'}`,
		insert: `INSERT INTO wallet.outbox_events (uid, destination, partition_key, type, data) VALUES ($1, $2, $3, $4, $5)`,
		del:    `DELETE FROM wallet.outbox_events WHERE uid = $1`,
		key:    func(i int) string { return fmt.Sprintf("wallet/%d", i) },
		topic:  func(typ string) string { return typ },
		message: func(e event) string {
			return fmt.Sprintf(`{"__outbox_table": "wallet.outbox_events", "uid": %q, "destination": %q, "partition_key": %q, "type": %q, "data": %q}`,
				e.ID, e.Type, e.Key, e.EventType, e.Payload)
		}},
}

// shardTablesDB makes the three tables of shardShapes in a database of its
// own and returns it with the configuration file of postgres.tables over
// them, or nil before Postgres 15 (shardDB).
func shardTablesDB(t *testing.T) (*db, string) {
	t.Helper()
	d := shardDB(t)
	if d == nil {
		return nil, ""
	}
	for _, s := range shardShapes {
		if s.create != "" {
			d.exec(t, s.create)
		}
	}
	return d, tablesConfig(t, shardShapes)
}

// shardTables are the tables of shardShapes as the shard publications list
// them.
func shardTables() []shard.Table {
	keys := []string{"aggregate_id", "stream_key", "partition_key"}
	out := make([]shard.Table, len(shardShapes))
	for i, s := range shardShapes {
		schema, table, _ := strings.Cut(s.table, ".")
		out[i] = shard.Table{Schema: schema, Name: table, KeyColumn: keys[i]}
	}
	return out
}

// outboxTable is newDB's outbox table keyed by column, as a shard
// publication lists it.
func outboxTable(column string) []shard.Table {
	return []shard.Table{{Schema: "public", Name: "outbox", KeyColumn: column}}
}

// Issue 35 §1: sharding with several tables, each hashed on its own key
// column. Three tables of different key columns and types over 2 shards:
// first a fixed set of rows, each counted by the shard that delivered it
// (the insert counter of its slot and table), which must be the shard its
// key hashes to and no other; then writers mixing the tables in one
// transaction, with logical messages, rollbacks and insert-then-delete,
// and one SIGKILL: nothing lost, nothing phantom, per-key order kept.
func TestShardsSeveralTables(t *testing.T) {
	d, cfg := shardTablesDB(t)
	if d == nil {
		return
	}
	const n = 2
	env := shardEnv(d, n)
	p := start(t, env, "-config", cfg)
	p.waitShardsStreaming(n)

	// Each row counted once, by its key's shard.
	want := map[[2]string]int{} // slot, table: rows
	var ids []string
	var topics []string
	for si, s := range shardShapes {
		typ := fmt.Sprintf("%s_r%d", d.name, si)
		topics = append(topics, s.topic(typ))
		for k := range 60 {
			id, key := uuid(), s.key(k)
			d.exec(t, s.insert, id, typ, key, "Happened", `{"n": 1}`)
			ids = append(ids, id)
			slot, _ := shard.Name(d.slot, shard.Of([]byte(key), n), n)
			want[[2]string{slot, s.table}]++
		}
	}
	recs := readUntil(t, topics, time.Minute, 2*time.Second, waitIDs(ids...))
	if len(recs) != len(ids) {
		t.Errorf("read %d records of the %d rows, want each once", len(recs), len(ids))
	}
	mfs, ok := p.scrape()
	if !ok {
		t.Fatal("no /metrics")
	}
	misrouted := 0
	for i := range n {
		slot, _ := shard.Name(d.slot, i, n)
		for _, s := range shardShapes {
			got, _ := seriesValue(mfs, "outboxd_wal_changes_total", map[string]string{"slot": slot, "op": "insert", "table": s.table})
			if w := want[[2]string{slot, s.table}]; int(got) != w {
				misrouted += max(int(got)-w, w-int(got))
				t.Errorf("slot %s delivered %v rows of %s, want %d (the rows whose key hashes to it)", slot, got, s.table, w)
			} else if w == 0 {
				t.Errorf("no row of %s hashes to slot %s: the test's keys do not spread", s.table, slot)
			}
		}
	}
	t.Logf("misrouted rows: %d", misrouted)

	// Writers mixing the tables, and one SIGKILL.
	l, loadDone, _ := shardTablesKilledOnce(t, d, p, env, cfg, n)
	r := verifyLoad(t, l, loadDone)
	if limit := n * (10000 + 2000); r.Duplicates > limit {
		t.Errorf("%d duplicates after one kill, more than the unacknowledged windows allow (%d)", r.Duplicates, limit)
	}
}

// Issue 35 §1: each table's row filter in a shard publication is checked
// at start-up. A table published without a filter (every shard would
// deliver its rows) or missing from one shard's publication (its rows of
// that shard would reach no slot) is refused with the statement that fixes
// it; shard 0's filter from before NULL keys had a shard, on one table, is
// fixed with a statement that touches that table alone (review S2), and
// fixed, its NULL-keyed rows named, even when another table is refused
// (review S3).
func TestShardsSeveralTablesFilterChecked(t *testing.T) {
	d, cfg := shardTablesDB(t)
	if d == nil {
		return
	}
	const n = 2
	env := shardEnv(d, n)
	tables := shardTables()
	pubs, _ := shard.Names("outboxd", n)
	create := func(i int, stmt string) {
		d.exec(t, `DROP PUBLICATION IF EXISTS `+pubs[i])
		d.exec(t, stmt)
	}
	create(0, shard.PublicationSQL(pubs[0], tables, 0, n))

	// orders.events without a filter in shard 1's publication.
	create(1, strings.Replace(shard.PublicationSQL(pubs[1], tables, 1, n),
		` WHERE (mod(hashtext("stream_key")::bigint & 4294967295, 2) = 1)`, "", 1))
	expectStartupError(t, env, `publication \\"outboxd_1of2\\" of shard 1 of 2 publishes every row of \\"orders\\".\\"events\\", so every shard would deliver every event of it; give it its filter with `+
		strings.ReplaceAll(regexp.QuoteMeta(shard.RefilterSQL(pubs[1], tables[1:2], nil, 1, n)), `"`, `\\"`), "-config", cfg)

	// wallet.outbox_events missing from shard 1's publication.
	create(1, shard.PublicationSQL(pubs[1], tables[:2], 1, n))
	expectStartupError(t, env, `publication \\"outboxd_1of2\\" of shard 1 of 2 does not include \\"wallet\\".\\"outbox_events\\", so none of its rows whose key hashes to shard 1 reach outboxd. .*: `+
		strings.ReplaceAll(regexp.QuoteMeta(shard.AddTableSQL(pubs[1], tables[2], 1, n)), `"`, `\\"`)+`\. Rows`, "-config", cfg)

	// A table added to postgres.tables whose key column the filters
	// cannot hash: refused, naming the table and the type.
	create(1, shard.PublicationSQL(pubs[1], tables, 1, n))
	d.exec(t, `CREATE TABLE public.uuid_keyed (id uuid PRIMARY KEY, aggregate_type text, aggregate_id uuid, event_type text, payload jsonb)`)
	withUUID := tablesConfig(t, append(slices.Clone(shardShapes), outboxShape{table: "public.uuid_keyed"}))
	expectStartupError(t, env, `the key column \\"aggregate_id\\" of \\"public\\".\\"uuid_keyed\\" is uuid; the shard filters hash it with hashtext\(\), which outboxd computes only for text and varchar`, "-config", withUUID)

	// Shard 0's filter on wallet.outbox_events from before NULL keys had
	// a shard: fixed, every table keeping its filter.
	create(1, shard.PublicationSQL(pubs[1], tables, 1, n))
	d.exec(t, `ALTER TABLE wallet.outbox_events ALTER COLUMN partition_key DROP NOT NULL`)
	stale := func(tables []shard.Table) string {
		return strings.Replace(shard.PublicationSQL(pubs[0], tables, 0, n), `"partition_key" IS NULL OR `, "", 1)
	}
	// With orders.events unfiltered beside it (review of issue 35 §1,
	// S3): the stale filter is fixed and its NULL-keyed rows named before
	// the start-up refuses orders.events; put right by hand, it starts.
	unfiltered := strings.Replace(stale(tables), ` WHERE ("stream_key" IS NULL OR mod(hashtext("stream_key")::bigint & 4294967295, 2) = 0)`, "", 1)
	if unfiltered == stale(tables) {
		t.Fatalf("no filter of orders.events removed from %s", unfiltered)
	}
	create(0, unfiltered)
	q := start(t, env, "-config", cfg)
	if code := q.waitExit(60 * time.Second); code == 0 {
		t.Fatal("outboxd started with orders.events unfiltered in shard 0's publication")
	}
	q.waitLog(`msg="fixed the row filter of the shard publication, which published rows with a NULL key to no shard;.*`+
		regexp.QuoteMeta(`SELECT * FROM \"wallet\".\"outbox_events\" WHERE \"partition_key\" IS NULL`), time.Second)
	q.waitLog(`publishes every row of \\"orders\\".\\"events\\"`, time.Second)
	// With a table outboxd does not list beside them: the fix touches
	// only the stale table, and the other stays (S2); with several tables
	// the start-up checks then refuse that table (a row of it would halt).
	d.exec(t, `CREATE TABLE public.other (k text)`)
	create(0, stale(append(slices.Clone(tables), shard.Table{Schema: "public", Name: "other", KeyColumn: "k"})))
	q = start(t, env, "-config", cfg)
	if code := q.waitExit(60 * time.Second); code == 0 {
		t.Fatal("outboxd started with public.other in shard 0's publication")
	}
	q.waitLog(`msg="fixed the row filter of the shard publication`, time.Second)
	q.waitLog(`publication \\"outboxd_0of2\\" also publishes public.other, which postgres.tables does not list`, time.Second)
	var other bool
	if err := d.pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_publication_tables WHERE pubname = $1 AND tablename = 'other')`, pubs[0]).Scan(&other); err != nil || !other {
		t.Errorf("public.other is no longer in %s (%v): the fix dropped it", pubs[0], err)
	}
	create(0, stale(tables))
	p := start(t, env, "-config", cfg)
	p.waitShardsStreaming(n)
	p.waitLog(`msg="fixed the row filter of the shard publication, which published rows with a NULL key to no shard;.*`+
		regexp.QuoteMeta(`SELECT * FROM \"wallet\".\"outbox_events\" WHERE \"partition_key\" IS NULL`), time.Second)
	for i, pub := range pubs {
		for _, tb := range tables {
			var filter *string
			if err := d.pool.QueryRow(context.Background(), `SELECT rowfilter FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3`,
				pub, tb.Schema, tb.Name).Scan(&filter); err != nil {
				t.Errorf("%s of %s: %v", tb, pub, err)
				continue
			}
			if filter == nil || !strings.Contains(*filter, tb.KeyColumn) || (i == 0) != strings.Contains(*filter, "IS NULL") {
				t.Errorf("%s of %s has the filter %v", tb, pub, filter)
			}
		}
	}
}

// Issue 35 §1: changing postgres.shards with several tables, by restart,
// while writers mix the tables: from 1 to 2 shards, SIGKILLed at a random
// step of the reshard and started again, then from 2 to 3. Every committed
// event arrives, per-key order holds, and the state table is in the schema
// of the first entry of postgres.tables.
func TestShardsSeveralTablesReshard(t *testing.T) {
	d, _ := shardTablesDB(t)
	if d == nil {
		return
	}
	cfg := tablesConfig(t, []outboxShape{shardShapes[1], shardShapes[2], shardShapes[0]}) // orders.events first
	env := func(n int) []string {
		return shardEnv(d, n, "OUTBOXD_KAFKA_MAX_BUFFERED_RECORDS=2000", "OUTBOXD_POSTGRES_STATUS_INTERVAL=100ms")
	}
	p := start(t, env(1), "-config", cfg)
	p.waitStreaming()
	l := newLedger()
	const writers, events = 2, 40000
	loadDone := make(chan error, 1)
	go func() { loadDone <- severalTablesLoad(context.Background(), d, shardShapes, writers, events, l) }()
	waitCommitted(t, l, events/8)
	if code := p.stop(syscall.SIGTERM, 60*time.Second); code != 0 {
		t.Fatalf("outboxd exited %d after SIGTERM", code)
	}
	steps := []string{"begin", "create", "cutover", "drain", "switch", "drop_old", "advance"}
	p = start(t, env(2), "-config", cfg)
	p.waitLog(`msg=resharding step=`+steps[mrand.IntN(len(steps))]+`|msg=streaming`, 30*time.Second)
	p.stop(syscall.SIGKILL, 10*time.Second)
	t.Logf("killed after the reshard steps %v at %d committed events", reshardSteps(p), l.committedCount())
	p = start(t, env(2), "-config", cfg)
	p.waitShardsStreaming(2)
	if code := p.stop(syscall.SIGTERM, 60*time.Second); code != 0 {
		t.Fatalf("outboxd exited %d after SIGTERM", code)
	}
	p = start(t, env(3), "-config", cfg)
	p.waitShardsStreaming(3)
	p.waitLog(`msg=resharded`, time.Second)
	t.Logf("resharded to 3 at %d committed events", l.committedCount())
	verifyLoad(t, l, loadDone)
	var slots []string
	if err := d.pool.QueryRow(context.Background(), `SELECT array_agg(slot_name::text ORDER BY slot_name) FROM pg_replication_slots WHERE database = current_database()`).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if want, _ := shard.Names(d.slot, 3); fmt.Sprint(slots) != fmt.Sprint(want) {
		t.Errorf("slots after the reshards: %v, want %v", slots, want)
	}
	var state string
	if err := d.pool.QueryRow(context.Background(), `SELECT string_agg(n.nspname, ',') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relname = 'outboxd_reshard'`).Scan(&state); err != nil || state != "orders" {
		t.Errorf("the state table outboxd_reshard is in the schemas %q (%v), want orders: the first entry's", state, err)
	}
}

// Issue 35 §1, exactly-once: the three tables over 2 shards, each shard
// with its own transactional id and position, SIGKILLed once under
// writers mixing the tables: a read_committed consumer sees every
// committed event once, in order per key.
func TestShardsSeveralTablesExactlyOnce(t *testing.T) {
	d, cfg := shardTablesDB(t)
	if d == nil {
		return
	}
	const n = 2
	env := eosEnv(d, "OUTBOXD_POSTGRES_SHARDS=2")
	p := start(t, env, "-config", cfg)
	p.waitShardsStreaming(n)
	l, loadDone, _ := shardTablesKilledOnce(t, d, p, env, cfg, n)
	if err := <-loadDone; err != nil {
		t.Fatal(err)
	}
	verifyExactlyOnce(t, d, shardShapes, l)
}

// shardTablesKilledOnce starts 2 writers mixing the tables of shardShapes
// (severalTablesLoad, 10,000 events), SIGKILLs p, running with env and
// cfg, once a quarter of them have committed, and starts outboxd again,
// waiting for its n shards to stream. It returns the load's ledger and
// outcome, and the new outboxd.
func shardTablesKilledOnce(t *testing.T, d *db, p *proc, env []string, cfg string, n int) (*ledger, <-chan error, *proc) {
	t.Helper()
	l := newLedger()
	const writers, events = 2, 10000
	loadDone := make(chan error, 1)
	go func() { loadDone <- severalTablesLoad(context.Background(), d, shardShapes, writers, events, l) }()
	waitCommitted(t, l, events/4)
	p.stop(syscall.SIGKILL, 10*time.Second)
	t.Logf("killed at %d committed events", l.committedCount())
	p = start(t, env, "-config", cfg)
	p.waitShardsStreaming(n)
	return l, loadDone, p
}

// Review of issue 35 §1, M1: a reshard checks every publication of the new
// layout before the cutover, those that exist already too. Two tables at 2
// shards, under writers on both: the configured publication outboxd, kept
// from an earlier outboxd at 1 shard of the first table only, lacks
// orders.events, so going to 1 shard is refused while the reshard is
// still creating (the old slots hold every event, no new slot is made);
// rows of orders.events written then, before the operator adds the table,
// arrive once the reshard finishes (without the check they were committed
// after the cutover to a publication without the table: lost). Then going to 3
// shards, outboxd_1of3, made earlier from the first table only, is put
// right before the new slots are made. Every committed event arrives.
func TestShardsSeveralTablesReshardStalePublication(t *testing.T) {
	d, _ := shardTablesDB(t)
	if d == nil {
		return
	}
	shapes := shardShapes[:2]
	tables := shardTables()[:2]
	cfg := tablesConfig(t, shapes)
	env := func(n int) []string { return shardEnv(d, n, "OUTBOXD_POSTGRES_STATUS_INTERVAL=100ms") }
	d.exec(t, `CREATE PUBLICATION outboxd FOR TABLE public.outbox`)
	p := start(t, env(2), "-config", cfg)
	p.waitShardsStreaming(2)
	l := newLedger()
	const writers, events = 2, 4000
	loadDone := make(chan error, 1)
	go func() { loadDone <- severalTablesLoad(context.Background(), d, shapes, writers, events, l) }()
	waitCommitted(t, l, events/4)
	if code := p.stop(syscall.SIGTERM, 60*time.Second); code != 0 {
		t.Fatalf("outboxd exited %d after SIGTERM", code)
	}

	expectStartupError(t, env(1), `checking the publications of the 1 new shards before the cutover: publication \\"outboxd\\" of shard 0 of 1 does not include \\"orders\\"\.\\"events\\".*ALTER PUBLICATION \\"outboxd\\" ADD TABLE \\"orders\\"\.\\"events\\"\..*up to the cutover those of the 2 old shards.*The reshard from 2 to 1 shards is still creating`, "-config", cfg)
	var phase string
	if err := d.pool.QueryRow(context.Background(), `SELECT phase FROM public.outboxd_reshard WHERE slot = $1`, d.slot).Scan(&phase); err != nil || phase != "creating" {
		t.Errorf("after the refusal the reshard's phase is %q (%v), want creating", phase, err)
	}
	slots := func() string {
		var s []string
		if err := d.pool.QueryRow(context.Background(), `SELECT array_agg(slot_name::text ORDER BY slot_name) FROM pg_replication_slots WHERE database = current_database()`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(s)
	}
	if got, want := slots(), fmt.Sprint([]string{d.slot + "_0of2", d.slot + "_1of2"}); got != want {
		t.Errorf("after the refusal the slots are %s, want the old ones alone: %s", got, want)
	}
	typ := d.name + "_late"
	var ids []string
	for k := range 40 {
		id := uuid()
		d.exec(t, shapes[1].insert, id, typ, shapes[1].key(k), "Happened", `{"n": 1}`)
		ids = append(ids, id)
	}
	d.exec(t, `ALTER PUBLICATION outboxd ADD TABLE orders.events`)
	p = start(t, env(1), "-config", cfg)
	p.waitStreaming()
	if recs := readUntil(t, []string{shapes[1].topic(typ)}, 30*time.Second, 2*time.Second, waitIDs(ids...)); len(recs) != len(ids) {
		t.Errorf("read %d records of the %d rows of orders.events written while the reshard was refused, want each once", len(recs), len(ids))
	}
	t.Logf("resharded to 1 at %d committed events", l.committedCount())
	if code := p.stop(syscall.SIGTERM, 60*time.Second); code != 0 {
		t.Fatalf("outboxd exited %d after SIGTERM", code)
	}

	pub, _ := shard.Name("outboxd", 1, 3)
	d.exec(t, shard.PublicationSQL(pub, tables[:1], 1, 3))
	p = start(t, env(3), "-config", cfg)
	p.waitShardsStreaming(3)
	p.waitLog(`msg="put a new shard's publication right before the reshard's cutover" publication=outboxd_1of3`, time.Second)
	p.waitLog(`msg=resharded`, 30*time.Second)
	t.Logf("resharded to 3 at %d committed events", l.committedCount())
	verifyLoad(t, l, loadDone)
	var filter *string
	if err := d.pool.QueryRow(context.Background(), `SELECT rowfilter FROM pg_publication_tables WHERE pubname = $1 AND schemaname = 'orders' AND tablename = 'events'`, pub).Scan(&filter); err != nil ||
		filter == nil || !strings.Contains(*filter, "stream_key") {
		t.Errorf("orders.events in %s: filter %v (%v), want the shard filter", pub, filter, err)
	}
}

// Review of issue 35 §1, S4: with one outbox table, the pipeline passes
// over another table's rows in a shared publication. Two tables at 2
// shards, then outboxd started with the first alone (a rolled-back
// deploy): the shard publications still list orders.events with outboxd's
// filter, whose rows would be passed over and confirmed. Refused at
// start-up, naming the table and the DROP TABLE.
func TestShardsSeveralTablesThenOneRefused(t *testing.T) {
	d, env := twoTablesRan(t)
	if d == nil {
		return
	}
	expectStartupError(t, env, `publication \\"outboxd_[01]of2\\" of shard [01] of 2 also publishes \\"orders\\".\\"events\\" with outboxd's shard filter on its column \\"stream_key\\", but postgres.tables does not list it: `+
		`.*ALTER PUBLICATION \\"outboxd_[01]of2\\" DROP TABLE \\"orders\\".\\"events\\"`)
}

// Review of issue 35 §1, S1: a table added to postgres.tables at 2 shards
// is refused once, with the one transaction that adds it to both shard
// publications (added one at a time, each shard would miss its rows
// written before its own ADD). Run as printed, outboxd starts and each
// shard delivers its rows of the table.
func TestShardsSeveralTablesAddTable(t *testing.T) {
	const n = 2
	d, env := twoTablesRan(t)
	if d == nil {
		return
	}
	cfg := tablesConfig(t, shardShapes)
	pubs, _ := shard.Names("outboxd", n)
	added := shardTables()[2:]
	stmt := shard.AddTablesSQL(pubs, [][]shard.Table{added, added})
	q := start(t, env, "-config", cfg)
	if code := q.waitExit(60 * time.Second); code == 0 {
		t.Fatal("outboxd started with wallet.outbox_events in no shard publication")
	}
	q.waitLog(`does not include \\"wallet\\".\\"outbox_events\\".*Add the tables to every shard's publication at once.*: `+strings.ReplaceAll(regexp.QuoteMeta(stmt), `"`, `\\"`), time.Second)
	d.exec(t, stmt)
	p := start(t, env, "-config", cfg)
	p.waitShardsStreaming(n)
	s := shardShapes[2]
	typ := d.name + "_added"
	var ids []string
	shards := map[int]bool{}
	for k := range 20 {
		id, key := uuid(), s.key(k)
		d.exec(t, s.insert, id, typ, key, "Happened", `{"n": 1}`)
		ids = append(ids, id)
		shards[shard.Of([]byte(key), n)] = true
	}
	if len(shards) != n {
		t.Fatalf("the keys hash to the shards %v only", shards)
	}
	if recs := readUntil(t, []string{s.topic(typ)}, 30*time.Second, 2*time.Second, waitIDs(ids...)); len(recs) != len(ids) {
		t.Errorf("read %d records of the %d rows of the added table, want each once", len(recs), len(ids))
	}
}

// Second review of issue 35 §1, M1: a table added to postgres.tables while
// a reshard from 2 to 3 shards is draining (the draining row, the new
// slots and their publications of the first two tables made as the loop
// makes them). The drain refuses the old publications' lack of the table
// with one transaction that adds it to the publications of both shard
// counts; the operator runs what was printed, then the application writes
// the table. Every row written after that is delivered (printed for the
// old shards alone, the rows after the cutover reached no new shard).
func TestShardsSeveralTablesDrainAddTable(t *testing.T) {
	d, _ := twoTablesRan(t)
	if d == nil {
		return
	}
	tables := shardTables()
	for i := range 3 {
		pub, _ := shard.Name("outboxd", i, 3)
		d.exec(t, shard.PublicationSQL(pub, tables[:2], i, 3))
		slot, _ := shard.Name(d.slot, i, 3)
		d.exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	}
	d.exec(t, shard.StateTableSQL("public"))
	d.exec(t, `INSERT INTO public.outboxd_reshard (slot, from_shards, to_shards, phase, cutover) VALUES ($1, 2, 3, 'draining', pg_current_wal_lsn())`, d.slot)
	// Rows of the first table after the cutover, so the old slots move past it.
	for k := range 5 {
		d.exec(t, shardShapes[0].insert, uuid(), d.name+"_a", shardShapes[0].key(k), "Happened", `{"n": 1}`)
	}
	cfg := tablesConfig(t, shardShapes)
	env := shardEnv(d, 3)
	q := start(t, env, "-config", cfg)
	if code := q.waitExit(60 * time.Second); code == 0 {
		t.Fatal("outboxd started with wallet.outbox_events in no shard publication")
	}
	m := q.waitLog(`does not include .*`, time.Second)
	if !strings.Contains(m, "outboxd_0of3") {
		t.Errorf("the refusal during the drain does not name the new shards' publications (outboxd_*of3), which lack the table too: %s", m)
	}
	stmt := strings.ReplaceAll(regexp.MustCompile(`BEGIN; .*?COMMIT;`).FindString(m), `\"`, `"`)
	if stmt == "" {
		t.Fatalf("the refusal prints no transaction: %s", m)
	}
	d.exec(t, stmt)
	s := shardShapes[2]
	typ := d.name + "_added"
	var ids []string
	for k := range 30 {
		id := uuid()
		d.exec(t, s.insert, id, typ, s.key(k), "Happened", `{"n": 1}`)
		ids = append(ids, id)
	}
	p := start(t, env, "-config", cfg)
	p.waitShardsStreaming(3)
	if recs := readUntil(t, []string{s.topic(typ)}, 30*time.Second, 3*time.Second, waitIDs(ids...)); len(recs) != len(ids) {
		t.Errorf("read %d records of the %d rows of the added table written after the printed statement ran, want each once", len(recs), len(ids))
	}
}

// Second review of issue 35 §1, S6: with a pattern in postgres.tables,
// slots of 2 shards in the database are refused leading with the way out
// that works: list the tables by name (setting postgres.shards back to 2
// is refused with a pattern).
func TestShardsPatternReshardRefused(t *testing.T) {
	d := newDB(t)
	d.exec(t, patternCreate("tenant_a"))
	for i := range 2 {
		slot, _ := shard.Name(d.slot, i, 2)
		d.exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	}
	expectStartupError(t, d.env(), `resharding with a pattern in postgres.tables \(public.outbox, tenant_\*.events\) is not supported: list the tables by name`, "-config", patternConfig(t))
}

// Review of issue 35 §1, S5: the reshard state table is in the schema of
// the first entry of postgres.tables. A reshard recorded in another
// entry's schema (postgres.tables reordered while it was in progress; the
// row is written here as the loop writes it, in phase switched) is
// refused, naming that state table, instead of being taken for none.
func TestShardsSeveralTablesReshardStateReordered(t *testing.T) {
	d, cfg := shardTablesDB(t) // public.outbox first
	if d == nil {
		return
	}
	d.exec(t, shard.StateTableSQL("orders"))
	d.exec(t, `INSERT INTO orders.outboxd_reshard (slot, from_shards, to_shards, phase, cutover) VALUES ($1, 1, 2, 'switched', '0/1')`, d.slot)
	expectStartupError(t, shardEnv(d, 2), `a reshard of slot \\"`+d.slot+`\\" from 1 to 2 shards \(phase switched\) is recorded in \\"orders\\".\\"outboxd_reshard\\", `+
		`but outboxd keeps the reshard state in the schema of the first entry of postgres.tables, \\"public\\".\\"outboxd_reshard\\"`, "-config", cfg)
}

// twoTablesRan makes the tables of shardShapes, runs outboxd on the first
// two at 2 shards until they stream, and stops it: the shard publications
// list those two. It returns the database and the environment of 2 shards,
// or nil before Postgres 15.
func twoTablesRan(t *testing.T) (*db, []string) {
	t.Helper()
	d, _ := shardTablesDB(t)
	if d == nil {
		return nil, nil
	}
	env := shardEnv(d, 2)
	p := start(t, env, "-config", tablesConfig(t, shardShapes[:2]))
	p.waitShardsStreaming(2)
	if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("outboxd exited %d after SIGTERM", code)
	}
	return d, env
}

// A reshard on an idle database (no write from the restart on): the
// cutover is the WAL insert position read once the transactions open at
// the check have ended; the old shards must still confirm it and the
// reshard finish. Then the rows written after it are delivered once
// (third review of issue 35 §1, M1).
func TestShardsReshardIdle(t *testing.T) {
	d, _ := shardTablesDB(t)
	if d == nil {
		return
	}
	cfg := tablesConfig(t, shardShapes)
	s := shardShapes[0]
	typ := d.name + "_idle"
	p := start(t, shardEnv(d, 2), "-config", cfg)
	p.waitShardsStreaming(2)
	var ids []string
	write := func() {
		for k := range 10 {
			id := uuid()
			d.exec(t, s.insert, id, typ, s.key(k), "Happened", `{"n": 1}`)
			ids = append(ids, id)
		}
	}
	write()
	if recs := readUntil(t, []string{s.topic(typ)}, 30*time.Second, time.Second, waitIDs(ids...)); len(recs) != len(ids) {
		t.Fatalf("read %d of %d before the reshard", len(recs), len(ids))
	}
	if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("outboxd exited %d after SIGTERM", code)
	}
	begin := time.Now()
	p = start(t, shardEnv(d, 3), "-config", cfg)
	p.waitShardsStreaming(3)
	p.waitLog(`msg=resharded`, 10*time.Second)
	t.Logf("idle reshard 2 -> 3 took %s; steps %v", time.Since(begin), reshardSteps(p))
	write()
	if recs := readUntil(t, []string{s.topic(typ)}, 30*time.Second, 2*time.Second, waitIDs(ids...)); len(recs) != len(ids) {
		t.Errorf("read %d records of %d rows, want each once", len(recs), len(ids))
	}
}
