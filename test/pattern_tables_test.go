package test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// patternShape is the shape of the tenant tables of the pattern tests:
// orders.events' columns (severalShapes[1]) under another name.
const patternRouter = `{id_column: event_id, route_by_column: stream, key_column: stream_no, event_type_column: kind, payload_column: body, topic_template: 'tenants.${routedByValue}'}`

func patternCreate(schema string) string {
	return fmt.Sprintf(`CREATE SCHEMA %[1]s; `+patternTable(schema), schema)
}

func patternTable(schema string) string {
	return fmt.Sprintf(`CREATE TABLE %[1]s.events (event_id uuid PRIMARY KEY, stream text NOT NULL, stream_no bigint NOT NULL,
		kind text NOT NULL, body jsonb NOT NULL, at timestamptz NOT NULL DEFAULT now())`, schema)
}

func patternConfig(t *testing.T) string {
	t.Helper()
	return writeConfig(t, "postgres:\n  tables:\n    - public.outbox\n    - name: tenant_*.events\n      router: "+patternRouter+
		"\nrouter:\n  messages:\n    unowned: ignore\n")
}

// Issue 35 §1: a table that a pattern of postgres.tables matches, created
// while outboxd streams, flows without a restart. Its rows written in the
// transaction that created it, those deleted again at once among them,
// are delivered, and so are the rows of a transaction that was open when
// the table was created and wrote it afterwards, and of a table made by
// CREATE SCHEMA's own CREATE TABLE. A creation rolled back
// delivers nothing. A logical message that names a new table before any
// row of it is delivered with the table's entry. 0 lost, 0 phantom, 0
// per-key order violations. A second pattern matches every tenant too: a
// new tenant's CREATE TABLE goes through, and it takes the first pattern's
// entry, once (review-patterns35 M2).
func TestPatternTablesCreatedWhileStreaming(t *testing.T) {
	d := newDB(t)
	d.exec(t, patternCreate("tenant_a"))
	cfg := writeConfig(t, "postgres:\n  tables:\n    - public.outbox\n    - name: tenant_*.events\n      router: "+patternRouter+
		"\n    - name: '*.events'\n      router: "+patternRouter+"\nrouter:\n  messages:\n    unowned: ignore\n")
	env := d.env()
	m := start(t, env, "migrate", "-config", cfg)
	if code := m.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("outboxd migrate exited %d", code)
	}
	m.waitLog(`two patterns of postgres.tables can match the same table`, time.Second)
	p := start(t, env, "-config", cfg)
	p.waitStreaming()
	p.waitLog(`msg="created publication" publication=outboxd table=public.outbox,tenant_a.events`, time.Second)

	ctx := context.Background()
	l := newLedger()
	typ := d.name + "_pt"
	seq := map[string]int{}
	ev := func(table string, key int) (event, string) {
		k := fmt.Sprint(key)
		seq[table+k]++
		e := event{ID: uuid(), Type: typ, Key: k, EventType: "Happened", Seq: seq[table+k], Payload: fmt.Sprintf(`{"seq": %d}`, seq[table+k])}
		if table == "public.outbox" {
			e.Type = typ + "_o"
			return e, `INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4, $5)`
		}
		e.Type = typ + "_" + strings.TrimSuffix(strings.TrimPrefix(table, "tenant_"), ".events")
		e.Topic = "tenants." + e.Type
		return e, `INSERT INTO ` + table + ` (event_id, stream, stream_no, kind, body) VALUES ($1, $2, $3::bigint, $4, $5)`
	}
	// write writes n rows of table in b, every third deleted again.
	write := func(b *pgx.Batch, table string, n int) []event {
		var evs []event
		for i := range n {
			e, ins := ev(table, i%4)
			b.Queue(ins, e.ID, e.Type, e.Key, e.EventType, e.Payload)
			if i%3 == 0 {
				col := "event_id"
				if table == "public.outbox" {
					col = "id"
				}
				b.Queue(`DELETE FROM `+table+` WHERE `+col+` = $1`, e.ID)
			}
			evs = append(evs, e)
		}
		return evs
	}
	tenants := []string{"tenant_a.events"}
	for i, name := range []string{"b", "c", "d", "e", "f"} {
		table := "tenant_" + name + ".events"
		// Created, written to, and partly deleted again in one transaction;
		// tenant_e by CREATE SCHEMA's own CREATE TABLE (review M1).
		b := &pgx.Batch{}
		if name == "e" {
			b.Queue("CREATE SCHEMA tenant_e " + patternTable("tenant_e"))
		} else {
			b.Queue("CREATE SCHEMA tenant_" + name)
			b.Queue(patternTable("tenant_" + name))
		}
		evs := write(b, table, 10)
		rollback := name == "d"
		err := runInOrder(ctx, d, b, rollback)
		switch {
		case err == errRollback:
			l.add(false, evs...)
			continue
		case err != nil:
			t.Fatal(err)
		}
		l.add(true, evs...)
		tenants = append(tenants, table)
		// Rows of every table after it, in mixed transactions.
		b = &pgx.Batch{}
		evs = write(b, "public.outbox", 3)
		for _, tb := range tenants {
			evs = append(evs, write(b, tb, 3)...)
		}
		if err := runBatch(ctx, d, b, false); err != nil {
			t.Fatal(err)
		}
		l.add(true, evs...)
		if i == 1 {
			openWhileCreated(t, d, l, ev)
		}
	}
	// A logical message that names a new table before any row of it does.
	d.exec(t, patternCreate("tenant_h"))
	e, _ := ev("tenant_h.events", 1)
	d.exec(t, `SELECT pg_logical_emit_message(true, 'outbox', $1)`, fmt.Sprintf(
		`{"__outbox_table": "tenant_h.events", "event_id": %q, "stream": %q, "stream_no": %s, "kind": %q, "body": %s}`, e.ID, e.Type, e.Key, e.EventType, e.Payload))
	l.add(true, e)
	noDuplicates(t, verifyLoad(t, l, closed()))
	p.waitLog(`delivering the rows of tenant_b.events, created while outboxd runs, as outbox events of postgres.tables\[1\] \(tenant_\*.events\)`, time.Second)
	// A table of the pattern dropped while outboxd runs (a tenant removed)
	// leaves the check that the outbox tables are still published, and
	// outboxd goes on (review-patterns35 M6); a table taken on while
	// streaming is in that check: removed from the publication, it stops
	// outboxd with its name.
	d.exec(t, `DROP TABLE tenant_b.events`)
	p.waitLog(`no longer checking that tenant_b.events is published`, 10*time.Second)
	b := &pgx.Batch{}
	evs := write(b, "tenant_c.events", 3)
	if err := runBatch(ctx, d, b, false); err != nil {
		t.Fatal(err)
	}
	l.add(true, evs...)
	noDuplicates(t, verifyLoad(t, l, closed()))
	d.exec(t, `ALTER PUBLICATION outboxd DROP TABLE tenant_c.events`)
	if code := p.waitExit(30 * time.Second); code == 0 {
		t.Fatalf("outboxd exited 0 after a table it took on was removed from the publication")
	}
	p.waitLog(`outbox table tenant_c.events is not published by publication`, time.Second)
}

// Review-patterns35 M6: a table of a pattern created, written and dropped
// while outboxd is down stops outboxd when it meets the rows, with the
// remedy that loses nothing: create the table again under its name. Done,
// the rows are delivered.
func TestPatternTablesDroppedBeforeDelivered(t *testing.T) {
	d := newDB(t)
	d.exec(t, patternCreate("tenant_a"))
	cfg := patternConfig(t)
	env := d.env()
	m := start(t, env, "migrate", "-config", cfg)
	if code := m.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("outboxd migrate exited %d", code)
	}
	p := start(t, env, "-config", cfg)
	p.waitStreaming() // the publication and the slot
	if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("outboxd exited %d on SIGTERM", code)
	}
	id, stream := uuid(), d.name+"_gone"
	d.exec(t, patternCreate("tenant_x"))
	d.exec(t, `INSERT INTO tenant_x.events (event_id, stream, stream_no, kind, body) VALUES ($1, $2, 1, 'Happened', '{}')`, id, stream)
	d.exec(t, `DROP SCHEMA tenant_x CASCADE`)
	p = start(t, env, "-config", cfg)
	if code := p.waitExit(60 * time.Second); code == 0 {
		t.Fatalf("outboxd exited 0 after the row of a table dropped before it was delivered")
	}
	p.waitLog(`published a row of tenant_x.events \(relation \d+\), which postgres.tables\[1\] \(tenant_\*.events\) matches, but that table was dropped`, time.Second)
	p.waitLog(`give the name tenant_x.events back to a table of the same columns`, time.Second)
	d.exec(t, patternCreate("tenant_x"))
	p = start(t, env, "-config", cfg)
	p.waitStreaming()
	readUntil(t, []string{"tenants." + stream}, time.Minute, 0, waitIDs(id))
}

// runInOrder is runBatch for statements that refer to the tables the
// statements before them create: each is sent once those before it ran.
func runInOrder(ctx context.Context, d *db, b *pgx.Batch, rollback bool) error {
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		for _, q := range b.QueuedQueries {
			if _, err := tx.Exec(ctx, q.SQL, q.Arguments...); err != nil {
				return err
			}
		}
		if rollback {
			return errRollback
		}
		return nil
	})
}

// closed is a load's outcome for a load already done.
func closed() <-chan error {
	c := make(chan error, 1)
	c <- nil
	return c
}

// openWhileCreated writes, in a transaction open while another creates
// tenant_g.events, a row of public.outbox before that creation and one of
// tenant_g.events after it; both are delivered. On Postgres minors before
// 17.5, 16.9, 15.13 and 14.18, a transaction open across a table's ADD
// TABLE was suspected of being decoded with the publication as it was
// before (review multi35b); here the ADD TABLE commits with the CREATE.
func openWhileCreated(t *testing.T, d *db, l *ledger, ev func(string, int) (event, string)) {
	t.Helper()
	ctx := context.Background()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	first, ins := ev("public.outbox", 9)
	if _, err := tx.Exec(ctx, ins, first.ID, first.Type, first.Key, first.EventType, first.Payload); err != nil {
		t.Fatal(err)
	}
	d.exec(t, patternCreate("tenant_g"))
	second, ins := ev("tenant_g.events", 9)
	if _, err := tx.Exec(ctx, ins, second.ID, second.Type, second.Key, second.EventType, second.Payload); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	l.add(true, first, second)
}

// A pattern without the event trigger outboxd migrate installs is refused
// at start-up, saying what to run; so is the trigger disabled. The trigger
// refuses a matching table made with its rows (CREATE TABLE AS), and a new
// table that does not fit its entry stops outboxd with its name, as it
// does at start-up.
func TestPatternTablesNeedTheTrigger(t *testing.T) {
	d := newDB(t)
	d.exec(t, patternCreate("tenant_a"))
	cfg := patternConfig(t)
	env := d.env()
	expectStartupError(t, env, `postgres.tables has the pattern tenant_\*.events, whose tables created while outboxd runs are added to publication \\?"outboxd\\?" by the event trigger outboxd_add_tables `+
		`in the transaction that creates them; that trigger is missing, and without it the rows of a new table are never delivered: run outboxd migrate as a superuser`, "-config", cfg)
	m := start(t, env, "migrate", "-config", cfg)
	if code := m.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("outboxd migrate exited %d", code)
	}
	d.exec(t, `ALTER EVENT TRIGGER outboxd_add_tables ENABLE`)
	expectStartupError(t, env, `that trigger is not enabled always, so it does not fire under session_replication_role = replica`, "-config", cfg)
	d.exec(t, `ALTER EVENT TRIGGER outboxd_add_tables DISABLE`)
	expectStartupError(t, env, `that trigger is disabled, .* run ALTER EVENT TRIGGER outboxd_add_tables ENABLE ALWAYS as a superuser`, "-config", cfg)
	// A table made with its rows in it is refused by the trigger.
	m = start(t, env, "migrate", "-config", cfg)
	if code := m.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("outboxd migrate exited %d", code)
	}
	p := start(t, env, "-config", cfg)
	p.waitStreaming()
	d.exec(t, `CREATE SCHEMA tenant_x`)
	_, err := d.pool.Exec(context.Background(), `CREATE TABLE tenant_x.events AS SELECT * FROM tenant_a.events`)
	if err == nil || !strings.Contains(err.Error(), "matches the outbox table pattern tenant_*.events of publication outboxd, which does not publish it") {
		t.Fatalf("CREATE TABLE AS of a matching table: %v, want the trigger's refusal", err)
	}
	// A new table that does not fit the entry stops outboxd, naming it;
	// the slot is not confirmed past its row.
	d.exec(t, `CREATE TABLE tenant_x.events (event_id uuid PRIMARY KEY, stream text NOT NULL, kind text NOT NULL, body jsonb NOT NULL)`)
	lsn := currentLSN(t, d)
	unfit := uuid()
	d.exec(t, `INSERT INTO tenant_x.events VALUES ($1, $2, 'Happened', '{}')`, unfit, d.name+"_x")
	if code := p.waitExit(30 * time.Second); code == 0 {
		t.Fatalf("outboxd exited 0 after a row of a new table that does not fit its pattern's entry")
	}
	p.waitLog(`published a row of tenant_x.events \(relation \d+\), created while outboxd ran, which postgres.tables\[1\] \(tenant_\*.events\) matches, but it does not fit that entry: `+
		`outbox table tenant_x.events has no column stream_no`, time.Second)
	if c := d.confirmedFlush(t); c > lsn {
		t.Errorf("the slot was confirmed to %X, past the row of the unfit table (written after %X)", c, lsn)
	}
	// At start-up, such a table is refused with its name and its entry.
	expectStartupError(t, env, `outbox table tenant_x.events has no column stream_no; add it or set the \*_column settings of postgres.tables\[1\] \(pattern tenant_\*.events\).router`, "-config", cfg)
	// The remedy: an entry of its own, by its exact name, which comes
	// before the pattern; its row is delivered (review-patterns35 M6, W2).
	cfg = writeConfig(t, "postgres:\n  tables:\n    - public.outbox\n    - name: tenant_*.events\n      router: "+patternRouter+
		"\n    - name: tenant_x.events\n      router: {id_column: event_id, route_by_column: stream, key_column: event_id, event_type_column: kind, payload_column: body, topic_template: 'tenants.${routedByValue}'}"+
		"\nrouter:\n  messages:\n    unowned: ignore\n")
	p = start(t, env, "-config", cfg)
	p.waitStreaming()
	readUntil(t, []string{"tenants." + d.name + "_x"}, time.Minute, 0, waitIDs(unfit))
}

// Review-patterns35 M5: outboxd as the least-privilege role of
// migrations/roles/least_privilege.sql, with a pattern. A tenant that the
// application's role creates while outboxd streams is delivered when the
// default privileges docs/configuration.md gives let the role read it.
// Without them, its first row stops outboxd with the GRANT for remedy (not
// as a table that does not fit its entry), the row is not passed over, and
// after the GRANT it is delivered.
func TestPatternTablesLeastPrivilege(t *testing.T) {
	requireTool(t, "psql")
	d := newDB(t)
	ctx := context.Background()
	d.exec(t, patternCreate("tenant_a"))
	cfg := patternConfig(t)
	m := start(t, d.env(), "migrate", "-config", cfg)
	if code := m.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("outboxd migrate exited %d", code)
	}
	role, app := "lp_"+randomSuffix(), "app_"+randomSuffix()
	const password = "Least-Pr1v-pw"
	t.Cleanup(func() {
		for _, r := range []string{app, role} {
			_, _ = d.pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE IF EXISTS %[1]s`, r))
		}
	})
	// The publication is made by a superuser for that role, FOR TABLE the
	// tables the pattern matches; the trigger adds the ones created later.
	d.exec(t, `CREATE PUBLICATION outboxd FOR TABLE public.outbox, tenant_a.events WITH (publish = 'insert, update', publish_via_partition_root = true)`)
	psql := exec.Command("psql", d.dsn, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "role="+role, "-v", "password="+password,
		"-v", "table=public.outbox", "-v", "schema=public", "-v", "publication=outboxd", "-f", "../migrations/roles/least_privilege.sql")
	if out, err := psql.CombinedOutput(); err != nil {
		t.Fatalf("psql -f migrations/roles/least_privilege.sql: %v\n%s", err, out)
	}
	d.exec(t, fmt.Sprintf(`GRANT USAGE ON SCHEMA tenant_a TO %[1]s; GRANT SELECT ON tenant_a.events TO %[1]s;
		CREATE ROLE %[2]s NOLOGIN; GRANT CREATE ON DATABASE %[3]s TO %[2]s;
		ALTER DEFAULT PRIVILEGES FOR ROLE %[2]s GRANT USAGE ON SCHEMAS TO %[1]s; ALTER DEFAULT PRIVILEGES FOR ROLE %[2]s GRANT SELECT ON TABLES TO %[1]s`, role, app, d.name))
	// The application: its own role, which creates and writes the tenants.
	appConn, err := pgx.Connect(ctx, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer appConn.Close(ctx)
	tenant := func(name string) (id, topic string) {
		t.Helper()
		id, stream := uuid(), d.name+"_"+name
		for _, q := range []string{`SET ROLE ` + app, patternCreate(name)} {
			if _, err := appConn.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		if _, err := appConn.Exec(ctx, `INSERT INTO `+name+`.events (event_id, stream, stream_no, kind, body) VALUES ($1, $2, 1, 'Happened', '{}')`, id, stream); err != nil {
			t.Fatal(err)
		}
		return id, "tenants." + stream
	}
	dsn := strings.Replace(d.dsn, "postgres://postgres@", fmt.Sprintf("postgres://%s:%s@", role, password), 1)
	env := replace(replace(d.env(), "OUTBOXD_POSTGRES_DSN", dsn), "OUTBOXD_POSTGRES_CREATE_PUBLICATION", "false")
	p := start(t, env, "-config", cfg)
	p.waitStreaming()
	id, topic := tenant("tenant_b")
	readUntil(t, []string{topic}, time.Minute, 0, waitIDs(id))

	// Without the default privileges: a halt that names the GRANT.
	d.exec(t, fmt.Sprintf(`ALTER DEFAULT PRIVILEGES FOR ROLE %[2]s REVOKE USAGE ON SCHEMAS FROM %[1]s; ALTER DEFAULT PRIVILEGES FOR ROLE %[2]s REVOKE SELECT ON TABLES FROM %[1]s`, role, app))
	id, topic = tenant("tenant_c")
	if code := p.waitExit(30 * time.Second); code == 0 {
		t.Fatalf("outboxd exited 0 after a row of a new table its role may not read")
	}
	p.waitLog(`outboxd's role may not read it: role `+role+` lacks USAGE on schema tenant_c; run GRANT USAGE ON SCHEMA`, time.Second)
	p.waitLog(`ALTER DEFAULT PRIVILEGES GRANT USAGE ON SCHEMAS TO`, time.Second)
	d.exec(t, fmt.Sprintf(`GRANT USAGE ON SCHEMA tenant_c TO %[1]s; GRANT SELECT ON tenant_c.events TO %[1]s`, role))
	p = start(t, env, "-config", cfg)
	p.waitStreaming()
	readUntil(t, []string{topic}, time.Minute, 0, waitIDs(id))
}

// Review-patterns35 S1: while outboxd streams with a pattern, it checks
// every postgres.slot_lag_interval that the event trigger is as migrate
// installed it and that every table the patterns match is published. The
// trigger disabled stops it with the statement that enables it; a tenant
// created while the trigger is disabled stops it naming the tenant's
// table, with the ADD TABLE, instead of streaming on without its rows.
func TestPatternTablesTriggerWatched(t *testing.T) {
	d := newDB(t)
	d.exec(t, patternCreate("tenant_a"))
	cfg := writeConfig(t, "postgres:\n  slot_lag_interval: 500ms\n  tables:\n    - name: tenant_*.events\n      router: "+patternRouter+"\nrouter:\n  messages:\n    unowned: ignore\n")
	env := d.env()
	m := start(t, env, "migrate", "-config", cfg)
	if code := m.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("outboxd migrate exited %d", code)
	}
	p := start(t, env, "-config", cfg)
	p.waitStreaming()
	d.exec(t, `ALTER EVENT TRIGGER outboxd_add_tables DISABLE`)
	if code := p.waitExit(15 * time.Second); code == 0 {
		t.Fatalf("outboxd exited 0 after the event trigger was disabled")
	}
	p.waitLog(`while outboxd ran: postgres.tables has the pattern tenant_\*.events, .*that trigger is disabled, .*run ALTER EVENT TRIGGER outboxd_add_tables ENABLE ALWAYS as a superuser`, time.Second)

	d.exec(t, `ALTER EVENT TRIGGER outboxd_add_tables ENABLE ALWAYS`)
	p = start(t, env, "-config", cfg)
	p.waitStreaming()
	// Disabled and a tenant created in one transaction: the check that
	// meets it finds both.
	d.exec(t, `ALTER EVENT TRIGGER outboxd_add_tables DISABLE; `+patternCreate("tenant_b")+`; ALTER EVENT TRIGGER outboxd_add_tables ENABLE ALWAYS`)
	if code := p.waitExit(15 * time.Second); code == 0 {
		t.Fatalf("outboxd exited 0 after a tenant was created that the publication lacks")
	}
	p.waitLog(`(?s)outbox table tenant_b.events, which postgres.tables\[0\] \(pattern tenant_\*.events\) matches, is not published by publication .*ALTER PUBLICATION .{1,3}outboxd.{1,3} ADD TABLE .{1,3}tenant_b.{1,3}\..{1,3}events`, time.Second)
	// The remedy: the next start finds it published.
	d.exec(t, `ALTER PUBLICATION outboxd ADD TABLE tenant_b.events`)
	p = start(t, env, "-config", cfg)
	p.waitStreaming()
	// An UNLOGGED tenant made so meanwhile stops it with the statements
	// that make it logged and publish it, not with an ADD TABLE, which
	// Postgres refuses for it (review-fix59 S3).
	d.exec(t, `ALTER EVENT TRIGGER outboxd_add_tables DISABLE; CREATE SCHEMA tenant_u; CREATE UNLOGGED TABLE tenant_u.events (event_id uuid PRIMARY KEY, stream text NOT NULL, `+
		`stream_no bigint NOT NULL, kind text NOT NULL, body jsonb NOT NULL); ALTER EVENT TRIGGER outboxd_add_tables ENABLE ALWAYS`)
	if code := p.waitExit(15 * time.Second); code == 0 {
		t.Fatalf("outboxd exited 0 after an UNLOGGED tenant was created")
	}
	p.waitLog(`while outboxd ran: outbox table tenant_u.events \(postgres.tables\[0\], pattern tenant_\*.events\) is UNLOGGED: .*ALTER TABLE .{1,3}tenant_u.{1,3}\..{1,3}events.{1,3} SET LOGGED; `+
		`ALTER PUBLICATION .{1,3}outboxd.{1,3} ADD TABLE .{1,3}tenant_u`, time.Second)
	remedy := p.waitLog(`BEGIN; ALTER EVENT TRIGGER outboxd_add_tables DISABLE; .*?; COMMIT`, time.Second)
	d.exec(t, strings.ReplaceAll(remedy, `\"`, `"`))
	p = start(t, env, "-config", cfg)
	p.waitStreaming()
}

// Review-fix59 M1: outboxd migrate with a new pattern, run while an outboxd
// with one outbox table streams, is refused before it changes anything:
// it would add the tenants the pattern matches to the publication, and the
// running outboxd would pass over their rows ("ignoring the changes to …")
// and confirm past them. Run once that outboxd has stopped, it adds them;
// a row written then is delivered by the outboxd started with the pattern.
// Run again with the same patterns while that outboxd streams (an
// upgrade), it goes through.
func TestPatternTablesMigrateRefusedWhileStreaming(t *testing.T) {
	d := newDB(t)
	d.exec(t, patternCreate("tenant_a"))
	env := d.env()
	p := start(t, env)
	p.waitStreaming()

	cfg := patternConfig(t)
	expectStartupError(t, env, `outboxd streams slot `+d.slot+` \(pid \d+\): stop it, run outboxd migrate, then start outboxd with this configuration. `+
		`Run now, migrate would add tenant_a.events, which the patterns of postgres.tables match, to publication \\?"outboxd\\?"`, "migrate", "-config", cfg)
	var published bool
	if err := d.pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = 'outboxd' AND schemaname = 'tenant_a')`).Scan(&published); err != nil {
		t.Fatal(err)
	}
	if published {
		t.Fatalf("the refused migrate added tenant_a.events to the publication")
	}
	if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("outboxd exited %d", code)
	}

	m := start(t, env, "migrate", "-config", cfg)
	if code := m.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("outboxd migrate exited %d", code)
	}
	m.waitLog(`added to the publication the tables that a pattern`, time.Second)
	typ := d.name + "_t"
	const ins = `INSERT INTO tenant_a.events (event_id, stream, stream_no, kind, body) VALUES ($1, $2, 1, 'Happened', '{}')`
	before := uuid()
	d.exec(t, ins, before, typ)
	p = start(t, env, "-config", cfg)
	p.waitStreaming()
	after := uuid()
	d.exec(t, ins, after, typ)
	readUntil(t, []string{"tenants." + typ}, 30*time.Second, 0, waitIDs(before, after))

	m = start(t, env, "migrate", "-config", cfg)
	if code := m.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("outboxd migrate with unchanged patterns, while outboxd streams, exited %d", code)
	}
}
