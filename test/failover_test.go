package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/wal"
)

// Postgres failover (issue 24): a primary and a physical streaming standby
// of it on loopback, each a Postgres of the test's own (scripts/testbed
// pg-start and pg-standby, the version of OUTBOXD_TESTBED_PG_VERSION),
// outboxd streaming through a DSN that names both with
// target_session_attrs=read-write. The primary is killed (immediate) and the
// standby promoted. On 17 and later a synchronised failover slot carries
// outboxd over; without one (14-16, the option off, or a copy not yet
// synchronised) outboxd stops with its message and creates no slot.
//
// The standby is synchronous (synchronous_standby_names), so that every
// COMMIT a writer saw succeed is on the standby: events Postgres itself
// loses in an asynchronous failover are not outboxd's to deliver.

// failoverSlot is the slot name of these tests: the clusters are their own.
const failoverSlot = "outboxd_failover"

// pgPair is a primary and a streaming standby of it.
type pgPair struct {
	primary, standby *ownPostgres
	major            int
	dsn              string // both hosts, the standby first, target_session_attrs=read-write
	// oldFirst is dsn with the primary first, the order docs/operations.md
	// shows: after a promotion the old primary, if it runs writable again,
	// is the first host that accepts.
	oldFirst string
}

// serverMajorAt returns the major version of the Postgres at dsn.
func serverMajorAt(t *testing.T, dsn string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var num int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&num); err != nil {
		t.Fatal(err)
	}
	return num / 10000
}

// addStandby makes a standby of primary with scripts/testbed/pg-standby
// (args are its options) and returns the pair.
func addStandby(t *testing.T, primary *ownPostgres, args ...string) *pgPair {
	t.Helper()
	return addStandbyConf(t, primary, "", args...)
}

// addStandbyConf is addStandby with conf, lines of postgresql.conf, added
// to the standby's settings (OUTBOXD_TESTBED_PG_CONF).
func addStandbyConf(t *testing.T, primary *ownPostgres, conf string, args ...string) *pgPair {
	t.Helper()
	dir, err := os.MkdirTemp("", "outboxd-standby-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o755)
	t.Cleanup(func() { os.RemoveAll(dir) })
	port := freePort(t)
	standby := &ownPostgres{t: t, dir: dir,
		env: append(os.Environ(), "OUTBOXD_TESTBED_DIR="+dir, fmt.Sprintf("OUTBOXD_TESTBED_PG_PORT=%d", port)),
		dsn: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)}
	if conf != "" {
		file := dir + "/extra.conf"
		if err := os.WriteFile(file, []byte(conf+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		standby.env = append(standby.env, "OUTBOXD_TESTBED_PG_CONF="+file)
	}
	standby.script("pg-standby", append([]string{"--primary", primary.dir}, args...)...)
	t.Cleanup(func() { standby.script("pg-stop") })
	return &pgPair{primary: primary, standby: standby, major: serverMajorAt(t, primary.dsn),
		dsn: fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write",
			hostPort(t, standby.dsn), hostPort(t, primary.dsn)),
		oldFirst: fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write",
			hostPort(t, primary.dsn), hostPort(t, standby.dsn))}
}

// kill stops the primary with pg_ctl's immediate mode, a crash.
func (p *pgPair) kill() { p.primary.stop("immediate") }

// promote promotes the standby (pg_ctl promote).
func (p *pgPair) promote() { p.standby.script("pg-standby", "--promote") }

// outboxDB creates the outbox table through dsn and returns the test's db,
// whose pool follows dsn's hosts.
func outboxDB(t *testing.T, dsn string) *db {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := migrations.Apply(ctx, conn.Conn(), "public", "outbox"); err != nil {
		t.Fatal(err)
	}
	return &db{name: "t_failover_" + randomSuffix(), dsn: dsn, pool: pool, slot: failoverSlot}
}

// slotCopy is a standby's row of the slot.
type slotCopy struct {
	exists, synced, temporary bool
	confirmed                 string
}

func (c slotCopy) usable() bool { return c.exists && c.synced && !c.temporary && c.confirmed != "" }

// onServer runs f on a connection of its own to the Postgres at dsn, with
// 10 s for all of it.
func onServer(t *testing.T, dsn string, f func(context.Context, *pgx.Conn)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	f(ctx, conn)
}

func readSlotCopy(t *testing.T, dsn, slot string) (c slotCopy) {
	t.Helper()
	onServer(t, dsn, func(ctx context.Context, conn *pgx.Conn) { c = readSlotCopyOn(ctx, t, conn, slot) })
	return c
}

func readSlotCopyOn(ctx context.Context, t *testing.T, conn *pgx.Conn, slot string) slotCopy {
	t.Helper()
	var c slotCopy
	var confirmed *string
	// synced came in 17; to_jsonb reads it where it exists.
	err := conn.QueryRow(ctx, `SELECT coalesce((to_jsonb(s) ->> 'synced')::bool, false), temporary, confirmed_flush_lsn::text
		FROM pg_replication_slots s WHERE slot_name = $1`, slot).
		Scan(&c.synced, &c.temporary, &confirmed)
	if err == pgx.ErrNoRows {
		return c
	}
	if err != nil {
		t.Fatal(err)
	}
	c.exists = true
	if confirmed != nil {
		c.confirmed = *confirmed
	}
	return c
}

// waitSynced waits until the standby holds a synchronised, persisted copy of
// the slot with a confirmed position, which is what survives a promotion
// (Postgres syncs every few seconds, up to 30 s apart while nothing changes,
// and persists a copy only once the primary's slot has passed the standby's
// own position). Meanwhile it writes an event to d's outbox every second,
// to a topic no test reads, so that the slot advances. It returns the time
// it took.
func waitSynced(t *testing.T, d *db, standbyDSN string, timeout time.Duration) (slotCopy, time.Duration) {
	t.Helper()
	start := time.Now()
	var nudged time.Time
	for {
		c := readSlotCopy(t, standbyDSN, d.slot)
		if c.usable() {
			return c, time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("the standby's copy of slot %s is not synchronised and persisted after %s: %+v", d.slot, timeout, c)
		}
		if time.Since(nudged) > time.Second {
			d.exec(t, insertSQL, uuid(), d.name+"_warmup", "agg-1", "Happened", `{}`)
			nudged = time.Now()
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// slotOn reports whether the Postgres at dsn has the slot.
func slotOn(t *testing.T, dsn, slot string) bool {
	t.Helper()
	return readSlotCopy(t, dsn, slot).exists
}

// stopLoad stops the writers after the primary was killed. The transaction
// each was retrying when stopped never reached a server that accepts
// writes, so leaving it out of the ledger loses nothing.
func stopLoad(t *testing.T, f *faultRun) {
	t.Helper()
	f.cancel()
	if err := <-f.loadDone; err != nil {
		t.Logf("load stopped: %v", err)
	}
	f.loadDone <- nil // for finish
}

// errorLine returns outboxd's fatal error line.
func errorLine(t *testing.T, p *proc) string {
	t.Helper()
	for _, line := range strings.Split(p.logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") || strings.HasPrefix(line, "outboxd: ") {
			return line
		}
	}
	t.Fatalf("no error line; log:\n%s", p.logs.String())
	return ""
}

// runStatus runs outboxd status with env and args and returns its output.
func runStatus(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(svc.bin, append([]string{"status"}, args...)...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("outboxd status: %v\n%s", err, out)
	}
	return string(out)
}

// mustContain fails t for each want (a regular expression) text lacks.
func mustContain(t *testing.T, what, text string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !regexp.MustCompile(w).MatchString(text) {
			t.Errorf("%s does not match %q:\n%s", what, w, text)
		}
	}
}

// (a) The failover test: a synchronised failover slot carries outboxd over
// to the promoted standby with nothing lost. On 14-16 failover_slot is a
// start-up error naming the version and the setting.
func TestFailoverWithFailoverSlot(t *testing.T) {
	primary := startOwnPostgres(t)
	if major := serverMajorAt(t, primary.dsn); major < 17 {
		d := outboxDB(t, primary.dsn)
		expectStartupError(t, d.env("OUTBOXD_POSTGRES_FAILOVER_SLOT=true"),
			fmt.Sprintf(`postgres\.failover_slot is true, but Postgres %d\.\S+ has no failover slots \(they came in 17\); set postgres\.failover_slot: false`, major))
		return
	}
	pair := addStandby(t, primary, "--synchronous")
	d := outboxDB(t, pair.dsn)
	env := d.env("OUTBOXD_POSTGRES_FAILOVER_SLOT=true", "OUTBOXD_POSTGRES_STANDBY_DSNS="+pair.standby.dsn)
	p := start(t, env)
	p.waitStreaming()
	p.waitLog(`msg="created replication slot; events committed from here on will be delivered" slot=`+failoverSlot+` lsn=\S+ failover=true`, time.Second)
	p.waitLog(`level=INFO msg="failover slot: standbys with sync_replication_slots = on keep a copy of it"`, time.Second)
	p.waitLog(`level=INFO msg="standby standby1 streams through slot standby1, which synchronized_standby_slots names`, time.Second)

	// The kill must come after the standby's copy is synchronised and
	// persisted, which takes up to a minute; the load starts after that.
	c, took := waitSynced(t, d, pair.standby.dsn, 3*time.Minute)
	t.Logf("the standby's copy is synchronised and persisted at %s after %s", c.confirmed, took.Round(time.Millisecond))
	status := runStatus(t, env, "-url", "http://"+p.addr)
	mustContain(t, "outboxd status", status, `failover +failover slot: standbys with sync_replication_slots = on keep a copy of it`,
		`failover +standby 127\.0\.0\.1:\d+ holds a synchronised copy of slot "`+failoverSlot+`" at \S+ \(here \S+\)`)

	spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 2, Events: pick(8000, 40000),
		TxSizes: []int{1, 10, 50}, RollbackPct: 5, SavepointPct: 5, Truth: true, Tolerant: true, Pace: 5 * time.Millisecond}
	f := startFaultRun(t, d, svc.brokers, spec)
	waitCommitted(t, f.l, spec.Events/3)
	pair.kill()
	atKill := f.l.committedCount()
	pair.promote()
	promoted := time.Now()
	t.Logf("primary killed at %d committed events, standby promoted", atKill)
	// The writers go on against the new primary.
	waitCommitted(t, f.l, min(atKill+spec.Events/5, spec.Events*9/10))
	f.finish("Postgres failover with a failover slot", 1, promoted,
		fmt.Sprintf("primary killed (immediate) at %d committed events, standby promoted; copy synchronised %s after outboxd started; restarts %s",
			atKill, took.Round(time.Second), restarts(p)))
	select {
	case <-p.done:
		t.Fatalf("outboxd exited across the failover: %v", p.err)
	default:
	}
	if n := strings.Count(p.logs.String(), "created replication slot"); n != 1 {
		t.Errorf("outboxd created the slot %d times, want once (before the failover)", n)
	}
	if !slotOn(t, pair.standby.dsn, d.slot) {
		t.Error("no slot on the new primary")
	}
}

// (b) A kill before the standby's copy is synchronised and persisted: the
// promoted standby has no slot, and outboxd stops with its message instead
// of creating one; a fresh outboxd refuses to create it too, also with
// create_slot: false. The standby runs with sync_replication_slots = off,
// so that it never holds a copy (rather than racing the ~25 s it takes to
// persist one).
func TestFailoverBeforeSlotSynced(t *testing.T) {
	primary := startOwnPostgres(t)
	if major := serverMajorAt(t, primary.dsn); major < 17 {
		// Before 17 a standby never holds a copy of a logical slot: every
		// promotion finds none, the case TestFailoverWithoutFailoverSlot
		// follows through.
		pair := addStandby(t, primary, "--synchronous")
		d := outboxDB(t, pair.dsn)
		p := start(t, d.env())
		p.waitStreaming()
		id := uuid()
		d.exec(t, insertSQL, id, d.name, "k", "Happened", `{}`)
		collect(t, svc.brokers, []string{d.name + "-events"}).waitFor(t, []string{id}, time.Minute)
		if slotOn(t, pair.standby.dsn, d.slot) {
			t.Fatalf("Postgres %d: the standby holds a copy of slot %s; failover slots came in 17", major, d.slot)
		}
		return
	}
	pair := addStandbyConf(t, primary, "sync_replication_slots = off", "--synchronous")
	d := outboxDB(t, pair.dsn)
	env := d.env("OUTBOXD_POSTGRES_FAILOVER_SLOT=true")
	p := start(t, env)
	p.waitStreaming()
	spec := loadSpec{Prefix: d.name, Types: 2, IDs: 20, Writers: 2, Events: 4000, TxSizes: []int{1, 5}, Truth: true, Tolerant: true, Pace: 5 * time.Millisecond}
	f := startFaultRun(t, d, svc.brokers, spec)
	waitCommitted(t, f.l, 100)
	f.c.waitFor(t, f.l.committedIDs(), time.Minute)
	c := readSlotCopy(t, pair.standby.dsn, d.slot)
	if c.exists {
		t.Fatalf("the standby has a copy of the slot with sync_replication_slots = off: %+v", c)
	}
	pair.kill()
	stopLoad(t, f)
	pair.promote()
	t.Log("primary killed with no copy of the slot on the standby, standby promoted")
	if code := p.waitExit(2 * time.Minute); code != 3 {
		t.Errorf("outboxd exited %d, want 3", code)
	}
	line := errorLine(t, p)
	mustContain(t, "the error", line,
		`replication slot \\"`+failoverSlot+`\\" is missing: the server is a standby promoted to timeline 2 at LSN \S+ \(outboxd last saw timeline 1\), and its copy on the standby was not synchronised and persisted yet`,
		`So every event committed on this server since the promotion at LSN \S+, until the slot is created again, will never be delivered \(no slot decodes it\), `+
			`and neither will those committed before the promotion after LSN \S+ \(the last confirmed transaction committed at \S+\)`,
		`then create the slot with SELECT pg_create_logical_replication_slot\('`+failoverSlot+`', 'pgoutput', false, false, true\) and start outboxd`)
	if slotOn(t, pair.standby.dsn, d.slot) {
		t.Error("a slot exists on the new primary")
	}
	// A fresh process: create_slot (true by default) does not apply on a
	// promoted server.
	expectStartupError(t, env, `replication slot \\"`+failoverSlot+`\\" does not exist, and this server is on timeline 2: it was promoted from a standby at LSN \S+ or restored from a backup`)
	// create_slot: false (configurations converted from Debezium) gets the
	// same message, not "set postgres.create_slot: true".
	expectStartupError(t, append(env, "OUTBOXD_POSTGRES_CREATE_SLOT=false"), `replication slot \\"`+failoverSlot+`\\" does not exist, and this server is on timeline 2: it was promoted`)
	if slotOn(t, pair.standby.dsn, d.slot) {
		t.Error("a fresh outboxd created the slot on the new primary")
	}
	mustContain(t, "outboxd status", runStatus(t, env),
		`failover +warning: the slot does not exist and this server is on timeline 2 \(promoted from a standby or restored from a backup\), where outboxd does not create it`)
	recordResult(t, result{Scenario: "Postgres failover before the failover slot was synchronised", Events: f.l.committedCount(), Faults: 1,
		Note: "outboxd stopped with the missing-slot message (exit 3) and created no slot; a fresh outboxd refused to create one on timeline 2"})
}

// (c) No failover slot (what 14-16 have, and 17+ with the option off): the
// promoted standby has no slot; outboxd stops with its message and creates
// none. Started again, the old primary still has the slot, and outboxd
// resumes from it and delivers everything committed there: it never
// confirmed past what Kafka holds.
func TestFailoverWithoutFailoverSlot(t *testing.T) {
	primary := startOwnPostgres(t)
	pair := addStandby(t, primary, "--synchronous")
	d := outboxDB(t, pair.dsn)
	// Kafka through a proxy that can stall it, so that records are in
	// flight, unconfirmed, when the primary dies.
	kafka := newProxy(t, svc.brokers[0], true)
	env := replace(d.env(), "OUTBOXD_KAFKA_BROKERS", kafka.Addr())
	p := start(t, env)
	p.waitStreaming()
	// A second instance, standby of the HA pair, never streams.
	standby := start(t, env)
	standby.waitLog(`msg="standby: another process holds the slot`, 30*time.Second)
	spec := loadSpec{Prefix: d.name, Types: 3, IDs: 30, Writers: 2, Events: pick(4000, 20000),
		TxSizes: []int{1, 5, 10}, RollbackPct: 5, Truth: true, Tolerant: true, Pace: 10 * time.Millisecond}
	f := startFaultRun(t, d, svc.brokers, spec)
	// Killed with transactions confirmed, and more in flight to a stalled
	// Kafka.
	waitCommitted(t, f.l, spec.Events/4)
	f.c.waitFor(t, f.l.committedIDs(), time.Minute)
	kafka.Stall()
	waitCommitted(t, f.l, f.l.committedCount()+spec.Events/8)
	deadline := time.Now().Add(30 * time.Second)
	for v, _ := p.metric("outboxd_sink_records_in_flight"); v == 0; v, _ = p.metric("outboxd_sink_records_in_flight") {
		if time.Now().After(deadline) {
			t.Fatal("no record in flight 30 s after Kafka stalled")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// What Postgres holds as confirmed just before the kill: outboxd's own
	// report of it is what is being checked.
	var primaryConfirmed string
	if err := d.pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, d.slot).Scan(&primaryConfirmed); err != nil {
		t.Fatal(err)
	}
	pair.kill()
	stopLoad(t, f) // nothing is committed on the new primary
	atKill := f.l.committedCount()
	pair.promote()
	if code := p.waitExit(2 * time.Minute); code != 3 {
		t.Errorf("outboxd exited %d, want 3", code)
	}
	why := "it was not a failover slot"
	if pair.major < 17 {
		why = fmt.Sprintf("Postgres %d has no failover slots", pair.major)
	}
	line := errorLine(t, p)
	mustContain(t, "the error", line,
		`replication slot \\"`+failoverSlot+`\\" is missing: the server is a standby promoted to timeline 2 at LSN \S+ \(outboxd last saw timeline 1\), and `+why,
		`So every event committed on this server since the promotion at LSN \S+, until the slot is created again, will never be delivered \(no slot decodes it\), `+
			`and neither will those committed before the promotion after LSN \S+ \(the last confirmed transaction committed at \S+\): `+
			`recover the first from the outbox table or the application, the second from the old primary's slot`)
	if code := standby.waitExit(time.Minute); code != 3 {
		t.Errorf("the standby instance exited %d, want 3", code)
	}
	mustContain(t, "the standby instance's error", errorLine(t, standby),
		`replication slot \\"`+failoverSlot+`\\" is missing: the server is a standby promoted to timeline 2 at LSN \S+ \(outboxd last saw timeline 1\)`)
	if slotOn(t, pair.standby.dsn, d.slot) {
		t.Error("a slot exists on the new primary")
	}
	expectStartupError(t, env, `replication slot \\"`+failoverSlot+`\\" does not exist, and this server is on timeline 2`)
	expectStartupError(t, append(env, "OUTBOXD_POSTGRES_CREATE_SLOT=false"), `replication slot \\"`+failoverSlot+`\\" does not exist, and this server is on timeline 2`)

	// The old primary comes back alone, without its standby.
	primary.script("pg-start")
	old, err := pgxpool.New(context.Background(), primary.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(old.Close)
	for _, sql := range []string{`ALTER SYSTEM RESET synchronous_standby_names`, `ALTER SYSTEM RESET synchronized_standby_slots`, `SELECT pg_reload_conf()`} {
		if _, err := old.Exec(context.Background(), sql); err != nil && !strings.Contains(sql, "synchronized_standby_slots") {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// outboxd confirmed nothing Kafka did not hold: every committed event
	// missing from Kafka when it stopped was committed after the position
	// it reported. Its slot on the old primary still has them.
	d.pool = old // the truth of the unknown COMMITs is the old primary's
	f.l.resolve(t, old)
	time.Sleep(2 * time.Second) // the collector reads what Kafka acknowledged before the stop
	confirmed := parseLSN(t, primaryConfirmed)
	missing := map[string]bool{}
	for _, id := range f.l.committedIDs() {
		missing[id] = true
	}
	for _, rec := range f.c.records() {
		delete(missing, header(rec, "id"))
	}
	commits := slotCommits(t, old, d.slot)
	past := 0
	for id := range missing {
		if end, ok := commits[id]; !ok || end <= confirmed {
			past++
		}
	}
	if len(missing) == 0 {
		t.Error("every committed event was in Kafka when outboxd stopped: nothing was in flight, so nothing is checked")
	}
	if past > 0 {
		t.Errorf("%d of the %d events missing from Kafka were committed at or before the confirmed position %s", past, len(missing), wal.LSN(confirmed))
	}
	t.Logf("%d committed events were not in Kafka when outboxd stopped, all committed after the slot's confirmed position %s before the kill", len(missing), wal.LSN(confirmed))

	// Recovery through the old primary's slot, as docs/operations.md
	// describes.
	p2 := start(t, replace(d.env(), "OUTBOXD_POSTGRES_DSN", primary.dsn))
	p2.waitStreaming()
	f.finish("Postgres failover without a failover slot", 1, time.Now(),
		fmt.Sprintf("Postgres %d; outboxd (and the HA pair's standby instance) stopped with the missing-slot message (exit 3) and created no slot; primary killed at %d committed events, "+
			"%d of them not in Kafka, all committed after the slot's confirmed position on the primary just before the kill; recovered through the old primary's slot", pair.major, atKill, len(missing)))
}

// slotCommits peeks at what the slot still holds (it is not consumed) and
// returns the end LSN of the transaction of each outbox row it inserts, by id.
func slotCommits(t *testing.T, pool *pgxpool.Pool, slot string) map[string]uint64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', 'outboxd')`, slot)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	dec := wal.NewDecoder()
	out := map[string]uint64{}
	var txn []string
	for rows.Next() {
		var lsn string
		var data []byte
		if err := rows.Scan(&lsn, &data); err != nil {
			t.Fatal(err)
		}
		msg, err := dec.Decode(wal.LSN(parseLSN(t, lsn)), bytes.Clone(data))
		if err != nil {
			t.Fatal(err)
		}
		switch m := msg.(type) {
		case *wal.Change:
			if i := m.Relation.Index("id"); m.Op == wal.Insert && m.Relation.Name == "outbox" && i >= 0 {
				txn = append(txn, string(m.Tuple[i].Data))
			}
		case *wal.Commit:
			for _, id := range txn {
				out[id] = uint64(m.EndLSN)
			}
			txn = nil
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Acceptance 4: the start-up check and outboxd status show the slot's
// failover state and the standbys' synchronisation.
func TestFailoverStatus(t *testing.T) {
	primary := startOwnPostgres(t)
	pair := addStandby(t, primary, "--no-synchronized-slots")
	d := outboxDB(t, pair.dsn)
	// A slot made without failover, as before the option was set.
	if _, err := d.pool.Exec(context.Background(), `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, d.slot); err != nil {
		t.Fatal(err)
	}
	env := d.env("OUTBOXD_POSTGRES_STANDBY_DSNS=" + pair.standby.dsn)
	status := runStatus(t, env)
	standbyAddr := regexp.QuoteMeta(hostPort(t, pair.standby.dsn))
	if pair.major < 17 {
		mustContain(t, "outboxd status", status,
			fmt.Sprintf(`failover +not a failover slot: Postgres %d has none \(they came in 17\), so a promoted standby has no copy of slot "%s" and outboxd stops there`, pair.major, failoverSlot),
			`failover +standby standby1 streams through slot standby1\n`)
		var rep struct {
			Failover struct {
				Major    int  `json:"server_major"`
				Failover bool `json:"slot_failover"`
				Standbys []struct {
					Name string `json:"application_name"`
					Slot string `json:"slot"`
				} `json:"standbys"`
			} `json:"failover"`
		}
		if err := json.Unmarshal([]byte(runStatus(t, env, "-json")), &rep); err != nil {
			t.Fatal(err)
		}
		if rep.Failover.Major != pair.major || rep.Failover.Failover || len(rep.Failover.Standbys) != 1 || rep.Failover.Standbys[0].Slot != "standby1" {
			t.Errorf("status -json failover = %+v", rep.Failover)
		}
		return
	}
	mustContain(t, "outboxd status", status,
		`failover +warning: not a failover slot: a promoted standby has no copy of slot "`+failoverSlot+`" and outboxd stops there; set postgres\.failover_slot: true`,
		`failover +standby standby1 streams through slot standby1\n`)

	// failover_slot alters the slot; synchronized_standby_slots is unset.
	env = append(env, "OUTBOXD_POSTGRES_FAILOVER_SLOT=true")
	p := start(t, env)
	p.waitStreaming()
	p.waitLog(`level=INFO msg="altered the replication slot to a failover slot \(postgres\.failover_slot: true\)" slot=`+failoverSlot, time.Second)
	p.waitLog(`level=INFO msg="failover slot: standbys with sync_replication_slots = on keep a copy of it" slot=`+failoverSlot+` failover=true`, time.Second)
	p.waitLog(`level=WARN msg="synchronized_standby_slots does not name standby standby1's slot standby1, .*run ALTER SYSTEM SET synchronized_standby_slots = 'standby1'`, time.Second)
	p.waitLog(`level=WARN msg="standby `+standbyAddr+`( holds no copy of slot|'s copy of slot \\"`+failoverSlot+`\\" is not persisted yet)`, time.Second)
	c, took := waitSynced(t, d, pair.standby.dsn, 3*time.Minute)
	t.Logf("copy synchronised at %s after %s", c.confirmed, took.Round(time.Millisecond))
	status = runStatus(t, env, "-url", "http://"+p.addr)
	mustContain(t, "outboxd status", status,
		`failover +failover slot: standbys with sync_replication_slots = on keep a copy of it`,
		`failover +warning: synchronized_standby_slots does not name standby standby1's slot standby1`,
		`failover +standby `+standbyAddr+` holds a synchronised copy of slot "`+failoverSlot+`" at \S+ \(here \S+\)`)
	var rep struct {
		Failover struct {
			Failover bool     `json:"slot_failover"`
			Named    []string `json:"synchronized_standby_slots"`
			Standbys []struct {
				Slot         string `json:"slot"`
				Synchronized bool   `json:"synchronized"`
			} `json:"standbys"`
			Copies []struct {
				Synced    bool `json:"synced"`
				Temporary bool `json:"temporary"`
			} `json:"standby_copies"`
		} `json:"failover"`
	}
	if err := json.Unmarshal([]byte(runStatus(t, env, "-json", "-url", "http://"+p.addr)), &rep); err != nil {
		t.Fatal(err)
	}
	fo := rep.Failover
	if !fo.Failover || len(fo.Named) != 0 || len(fo.Standbys) != 1 || fo.Standbys[0].Slot != "standby1" || fo.Standbys[0].Synchronized ||
		len(fo.Copies) != 1 || !fo.Copies[0].Synced || fo.Copies[0].Temporary {
		t.Errorf("status -json failover = %+v", fo)
	}
}

// A DSN that names a standby first and no target_session_attrs: outboxd
// refuses the standby (retryably: exit 1) instead of creating its slot
// there, where it would begin at the promotion, past whatever the primary
// committed in between.
func TestFailoverStandbyRefused(t *testing.T) {
	primary := startOwnPostgres(t)
	pair := addStandby(t, primary)
	d := outboxDB(t, primary.dsn) // the table and the publication, through the primary
	if _, err := d.pool.Exec(context.Background(), wal.PublicationSQL("outboxd", "public", "outbox")); err != nil {
		t.Fatal(err)
	}
	standby, err := pgx.Connect(context.Background(), pair.standby.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close(context.Background())
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var replayed bool
		if err := standby.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = 'outboxd')`).Scan(&replayed); err != nil {
			t.Fatal(err)
		}
		if replayed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the standby has not replayed the publication after a minute")
		}
	}
	env := d.env("OUTBOXD_POSTGRES_DSN=" + fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable",
		hostPort(t, pair.standby.dsn), hostPort(t, primary.dsn)))
	expectStartupError(t, env, `connected to a standby \(`+regexp.QuoteMeta(hostPort(t, pair.standby.dsn))+
		` is in recovery\); outboxd needs the primary: add target_session_attrs=read-write to postgres\.dsn`)
	for _, dsn := range []string{primary.dsn, pair.standby.dsn} {
		if slotOn(t, dsn, d.slot) {
			t.Errorf("outboxd created a slot on %s", hostPort(t, dsn))
		}
	}
}

// A running outboxd whose slot was lost in a promotion, and created again
// on the new primary before outboxd's next pipeline start (by hand, or by a
// promotion script), stops with the promotion message: resuming from the
// new slot would skip everything the old one had not confirmed. outboxd
// connects as a role of its own, held off the new primary (CONNECTION
// LIMIT 0, which does not end connections already open) until the slot is
// there.
func TestFailoverSlotCreatedAfterPromotion(t *testing.T) {
	primary := startOwnPostgres(t)
	pair := addStandby(t, primary, "--synchronous")
	d := outboxDB(t, pair.dsn)
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE ROLE outboxd_fo LOGIN REPLICATION PASSWORD 'fo'`,
		`GRANT SELECT ON public.outbox TO outboxd_fo`,
		wal.PublicationSQL("outboxd", "public", "outbox"),
	} {
		if _, err := d.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	env := d.env("OUTBOXD_POSTGRES_DSN=" + strings.Replace(pair.dsn, "postgres://postgres@", "postgres://outboxd_fo:fo@", 1))
	p := start(t, env)
	p.waitStreaming()
	ids := []string{uuid(), uuid()}
	for _, id := range ids {
		d.exec(t, insertSQL, id, d.name, "agg-1", "Happened", `{}`)
	}
	c := collect(t, svc.brokers, []string{d.name + "-events"})
	c.waitFor(t, ids, time.Minute)
	if _, err := d.pool.Exec(ctx, `ALTER ROLE outboxd_fo CONNECTION LIMIT 0`); err != nil {
		t.Fatal(err)
	}
	pair.kill()
	pair.promote()
	p.waitLog(`pipeline stopped; restarting`, time.Minute)
	promoted, err := pgx.Connect(ctx, pair.standby.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer promoted.Close(ctx)
	if _, err := wal.CreateSlot(ctx, promoted, d.slot, false); err != nil {
		t.Fatal(err)
	}
	if _, err := promoted.Exec(ctx, `ALTER ROLE outboxd_fo CONNECTION LIMIT -1`); err != nil {
		t.Fatal(err)
	}
	if code := p.waitExit(time.Minute); code != 3 {
		t.Errorf("outboxd exited %d, want 3", code)
	}
	mustContain(t, "the error", errorLine(t, p),
		`replication slot \\"`+failoverSlot+`\\" is missing: the server is a standby promoted to timeline 2 at LSN \S+ \(outboxd last saw timeline 1\), `+
			`and the slot there now is not a synchronised copy of the one outboxd used: it was created after the promotion, at \S+\. So every event committed on this server since the promotion at LSN \S+`)
	if n := strings.Count(p.logs.String(), `msg=streaming`); n != 1 {
		t.Errorf("outboxd started streaming %d times, want once (before the kill)", n)
	}
}

// A server that does not tell its timeline (pg_walfile_name revoked from
// the role): outboxd cannot tell a first start from a slot lost in a
// promotion, so it creates no slot and says how to create it (it used to
// warn and create it). Once the slot exists it streams, with a warning.
func TestFailoverTimelineUnreadable(t *testing.T) {
	primary := startOwnPostgres(t)
	d := outboxDB(t, primary.dsn)
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE ROLE outboxd_tl LOGIN REPLICATION PASSWORD 'tl'`,
		`GRANT SELECT ON public.outbox TO outboxd_tl`,
		`REVOKE EXECUTE ON FUNCTION pg_walfile_name(pg_lsn) FROM PUBLIC`,
		wal.PublicationSQL("outboxd", "public", "outbox"),
	} {
		if _, err := d.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	env := d.env("OUTBOXD_POSTGRES_DSN=" + strings.Replace(primary.dsn, "postgres://postgres@", "postgres://outboxd_tl:tl@", 1))
	expectStartupError(t, env, `replication slot \\"`+failoverSlot+`\\" does not exist, and outboxd cannot tell whether this server was promoted or restored since the slot was last used \(.*permission denied for function pg_walfile_name.*\), so it does not create it\. `+
		`If no outboxd used \\"`+failoverSlot+`\\" on this server or the one it was promoted from, create it with SELECT pg_create_logical_replication_slot\('`+failoverSlot+`', 'pgoutput'\)`)
	if slotOn(t, primary.dsn, d.slot) {
		t.Fatal("outboxd created the slot without knowing the timeline")
	}
	if _, err := d.pool.Exec(ctx, wal.CreateSlotSQL(d.slot, false)); err != nil {
		t.Fatal(err)
	}
	p := start(t, env)
	p.waitStreaming()
	p.waitLog(`level=WARN msg="cannot read the server's timeline; keeping the one last seen`, time.Second)
	id := uuid()
	d.exec(t, insertSQL, id, d.name, "agg-1", "Happened", `{}`)
	collect(t, svc.brokers, []string{d.name + "-events"}).waitFor(t, []string{id}, time.Minute)
}

// slotState is the slot's row on the Postgres at dsn: whether a walsender
// holds it, and its confirmed position.
func slotState(t *testing.T, dsn, slot string) (active bool, confirmed string) {
	t.Helper()
	onServer(t, dsn, func(ctx context.Context, conn *pgx.Conn) {
		if err := conn.QueryRow(ctx, `SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).
			Scan(&active, &confirmed); err != nil {
			t.Fatalf("reading slot %s on %s: %v", slot, hostPort(t, dsn), err)
		}
	})
	return active, confirmed
}

// endWalsender ends the walsender that holds the slot on the Postgres at
// dsn, as a dropped connection would; false when none held it.
func endWalsender(t *testing.T, dsn, slot string) (ended bool) {
	t.Helper()
	onServer(t, dsn, func(ctx context.Context, conn *pgx.Conn) {
		if err := conn.QueryRow(ctx, `SELECT coalesce(bool_or(pg_terminate_backend(active_pid)), false) FROM pg_replication_slots WHERE slot_name = $1 AND active`, slot).
			Scan(&ended); err != nil {
			t.Fatal(err)
		}
	})
	return ended
}

// Issue 32 item 9: split brain after a promotion. The DSN lists the old
// primary first, as docs/operations.md does. After the promotion the old
// primary is started again, writable on timeline 1 with the original slot:
// a running outboxd that reconnects reaches it first and refuses it (it
// saw timeline 2), retrying until the old primary is fenced; a fresh
// outboxd refuses it at start-up, because the DSN's other host (or a host
// of postgres.standby_dsns) is a primary on timeline 2. Neither ever
// streams from it. Nor does the standby instance of an HA pair, which saw
// timeline 2 only where the slot was held, when its poll connection drops
// and it reaches the old primary, whose slot is free. Any Postgres version:
// no failover slot is involved.
func TestFailoverOldPrimaryBack(t *testing.T) {
	primary := startOwnPostgres(t)
	pair := addStandby(t, primary)
	d := outboxDB(t, pair.oldFirst)
	env := d.env()
	ctx := context.Background()
	c := collect(t, svc.brokers, []string{d.name + "-events"})
	p := start(t, env)
	p.waitStreaming()
	// x is the standby instance of an HA pair: it starts on timeline 1
	// and is stopped (SIGSTOP) through the promotion, so that it never
	// sees the slot free on timeline 2 (review of issue 32, finding 2).
	x := start(t, append(env[:len(env):len(env)], "OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=100ms"))
	const standbyLog = `standby: another process holds the slot`
	x.waitLog(standbyLog, 30*time.Second)
	before := []string{uuid(), uuid()}
	for _, id := range before {
		d.exec(t, insertSQL, id, d.name, "agg-1", "Happened", `{}`)
	}
	c.waitFor(t, before, time.Minute)

	// The promotion: the slot was not a failover slot, so outboxd stops
	// and says what is missing (everything committed on the new primary
	// until the slot is created again).
	if err := x.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	pair.kill()
	pair.promote()
	if code := p.waitExit(time.Minute); code != 3 {
		t.Fatalf("outboxd exited %d after the promotion, want 3", code)
	}
	mustContain(t, "the error", errorLine(t, p), `the server is a standby promoted to timeline 2`,
		`So every event committed on this server since the promotion at LSN \S+, until the slot is created again, will never be delivered`)
	promoted, err := pgx.Connect(ctx, pair.standby.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer promoted.Close(ctx)
	if _, err := wal.CreateSlot(ctx, promoted, d.slot, false); err != nil { // the operator's step
		t.Fatal(err)
	}
	// The old primary is down: outboxd streams from the new one. The
	// standby instance, let run again, finds its connection to the old
	// primary gone and polls the new one, where the slot is held.
	p2 := start(t, env)
	p2.waitStreaming()
	if err := x.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); strings.Count(x.logs.String(), standbyLog) < 2; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) || x.exited() {
			t.Fatalf("the standby instance did not wait on the new primary:\n%s", x.logs.String())
		}
	}
	after := []string{uuid()}
	insertRetrying(t, d, after[0], time.Minute) // the pool's connections to the old primary fail first
	c.waitFor(t, after, time.Minute)

	// The old primary comes back writable, on timeline 1, with the slot.
	primary.script("pg-start")
	_, oldConfirmed := slotState(t, primary.dsn, d.slot)
	oldAddr, newAddr := regexp.QuoteMeta(hostPort(t, primary.dsn)), regexp.QuoteMeta(hostPort(t, pair.standby.dsn))
	splitBrain := `split brain: ` + oldAddr + ` is a primary on timeline 1, and outboxd saw a primary on timeline 2`

	// The standby instance's poll connection drops; it reconnects, reaches
	// the old primary first, where the slot is free, and refuses it: it saw
	// timeline 2 where the slot was held (review of issue 32, finding 2).
	onServer(t, pair.standby.dsn, func(ctx context.Context, conn *pgx.Conn) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
				AND (query LIKE '%pg_replication_slots%' OR query LIKE '%current_database()%')`).Scan(&n); err != nil || n == 0 {
			t.Fatalf("ending the standby instance's poll connection: %d ended, %v", n, err)
		}
	})
	x.waitLog(`level=WARN msg="pipeline stopped; restarting from the slot's confirmed position" err="`+splitBrain+` on `+newAddr+`; `+oldAddr+` is the old primary`, 30*time.Second)

	// The running outboxd's connection drops; it reconnects, reaches the old
	// primary first, and refuses it.
	if !endWalsender(t, pair.standby.dsn, d.slot) {
		t.Fatal("no walsender held the slot on the new primary")
	}
	p2.waitLog(`level=WARN msg="pipeline stopped; restarting from the slot's confirmed position" err="`+splitBrain+` on `+newAddr+`; `+oldAddr+` is the old primary`, 30*time.Second)

	// A fresh outboxd refuses it at start-up: the DSN's other host, and a
	// host of postgres.standby_dsns, is a primary on timeline 2.
	p3 := start(t, env)
	if code := p3.waitExit(30 * time.Second); code != 1 {
		t.Errorf("a fresh outboxd exited %d, want 1", code)
	}
	mustContain(t, "the fresh outboxd's error", errorLine(t, p3), splitBrain+` on `+newAddr+`;`, `Fence it \(stop it, or rebuild it as a standby of the new primary\) or take it out of postgres\.dsn`)
	p4 := start(t, d.env("OUTBOXD_POSTGRES_DSN="+primary.dsn, "OUTBOXD_POSTGRES_STANDBY_DSNS="+pair.standby.dsn))
	if code := p4.waitExit(30 * time.Second); code != 1 {
		t.Errorf("outboxd with the new primary in standby_dsns exited %d, want 1", code)
	}
	mustContain(t, "the error with standby_dsns", errorLine(t, p4), splitBrain+` on `+newAddr+` \(a host of postgres\.standby_dsns, a primary now\)`)
	for _, q := range []*proc{p3, p4} {
		if strings.Contains(q.logs.String(), "msg=streaming") {
			t.Errorf("a fresh outboxd streamed:\n%s", q.logs.String())
		}
	}
	if active, confirmed := slotState(t, primary.dsn, d.slot); active || confirmed != oldConfirmed {
		t.Errorf("the old primary's slot: active %v, confirmed %s (was %s); want it untouched", active, confirmed, oldConfirmed)
	}
	// Neither instance of the pair streamed while the old primary was up
	// (every reconnection reaches it first).
	streamed := func(p *proc) int { return strings.Count(p.logs.String(), "msg=streaming") }
	if n, m := streamed(p2), streamed(x); n != 1 || m != 0 {
		t.Errorf("while the old primary was back, the active instance streamed %d times (want once, before) and the standby instance %d (want never):\n%s",
			n, m, x.logs.String())
	}

	// The standby instance has done its part. Left running, it would exit 3
	// on the new primary once the slot is free there: it last used the
	// slot on timeline 1, and the one there now is the operator's, created
	// after the promotion (not a synchronised copy).
	if code := x.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("the standby instance exited %d on SIGTERM", code)
	}

	// Fenced (stopped), the old primary is out of the way: the running
	// outboxd streams from the new one again, without a restart.
	primary.stop("fast")
	last := []string{uuid()}
	insertRetrying(t, d, last[0], time.Minute)
	c.waitFor(t, last, time.Minute)
	if n := streamed(p2); n < 2 {
		t.Errorf("outboxd streamed %d times; want again after the old primary was fenced", n)
	}
	select {
	case <-p2.done:
		t.Fatalf("the running outboxd exited: %v", p2.err)
	default:
	}
}

// Issue 32 item 8: with a failover slot (17 and later), an HA pair of
// outboxd instances swaps: the first active instance loses the slot to its
// standby and becomes the standby itself, with the position it confirmed
// long ago. The standby's copy of the slot then moves past that position,
// the primary is killed and the standby promoted. When the active instance
// stops, the former active takes over from the copy: it must not judge the
// copy by its own old position (it used to exit 3 with the promotion
// message).
func TestFailoverFormerActiveTakesOver(t *testing.T) {
	if major := serverMajor(t); major < 17 { // the test bed's version, which startOwnPostgres runs too
		t.Logf("Postgres %d has no failover slots: nothing to take over after a promotion", major)
		return
	}
	primary := startOwnPostgres(t)
	pair := addStandby(t, primary, "--synchronous")
	d := outboxDB(t, pair.dsn)
	env := d.env("OUTBOXD_POSTGRES_FAILOVER_SLOT=true", "OUTBOXD_POSTGRES_STANDBY_DSNS="+pair.standby.dsn,
		"OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=100ms")
	c := collect(t, svc.brokers, []string{d.name + "-events"})
	a, b := startPair(t, env)
	first := []string{uuid(), uuid()}
	for _, id := range first {
		d.exec(t, insertSQL, id, d.name, "agg-1", "Happened", `{}`)
	}
	c.waitFor(t, first, time.Minute)

	// The swap: a's connection drops until b takes the slot; a, still
	// running, becomes the standby.
	for i := 0; !strings.Contains(b.logs.String(), "took over the slot from the previous holder"); i++ {
		if i == 50 {
			t.Fatal("the standby instance never took the slot over")
		}
		endWalsender(t, primary.dsn, d.slot)
		time.Sleep(200 * time.Millisecond)
	}
	a.waitLog(`standby: another process holds the slot`, 30*time.Second)
	_, atSwap := slotState(t, primary.dsn, d.slot)

	// Load through b; the standby's copy moves past the position a confirmed.
	second := make([]string, 50)
	for i := range second {
		second[i] = uuid()
		d.exec(t, insertSQL, second[i], d.name, fmt.Sprintf("agg-%d", i%4), "Happened", `{}`)
	}
	c.waitFor(t, second, time.Minute)
	for start := time.Now(); ; {
		cp, _ := waitSynced(t, d, pair.standby.dsn, 3*time.Minute)
		if parseLSN(t, cp.confirmed) > parseLSN(t, atSwap) {
			t.Logf("the standby's copy is at %s, past %s where the swap left the slot, after %s", cp.confirmed, atSwap, time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 3*time.Minute {
			t.Fatalf("the standby's copy stayed at %s, not past %s", cp.confirmed, atSwap)
		}
		d.exec(t, insertSQL, uuid(), d.name+"_warmup", "agg-1", "Happened", `{}`)
		time.Sleep(200 * time.Millisecond)
	}

	pair.kill()
	pair.promote()
	// b stops; a, the former active, takes over from the copy.
	if code := b.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("the active instance exited %d on SIGTERM", code)
	}
	third := []string{uuid(), uuid()}
	for _, id := range third {
		insertRetrying(t, d, id, time.Minute)
	}
	for deadline := time.Now().Add(time.Minute); c.missing(third) > 0; time.Sleep(100 * time.Millisecond) {
		if a.exited() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events committed after the promotion not in Kafka after a minute", c.missing(third), len(third))
		}
	}
	select {
	case <-a.done:
		t.Fatalf("the former active instance exited %d after the promotion: %s", a.cmd.ProcessState.ExitCode(), errorLine(t, a))
	default:
	}
	if n := strings.Count(a.logs.String(), "msg=streaming"); n < 2 {
		t.Errorf("the former active instance streamed %d times, want again after the promotion", n)
	}
}

// insertRetrying inserts an event with id through d's pool until it
// succeeds, for up to timeout: right after a promotion the pool's
// connections to the old primary fail first.
func insertRetrying(t *testing.T, d *db, id string, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(100 * time.Millisecond) {
		_, err := d.pool.Exec(context.Background(), insertSQL, id, d.name, "agg-1", "Happened", `{}`)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("inserting event %s: %v", id, err)
		}
	}
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
