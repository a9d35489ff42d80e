package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/shard"
)

// Sharded slots (postgres.shards, issue 28) through the outboxd binary: the
// delivery workload, SIGKILLs, the application's own writes, logical
// messages and resharding by restart, each checked with the ledger.

// shardDB is newDB with a cleanup that drops every slot of the database,
// the shards' included. Before Postgres 15 (no publication row filters) it
// checks instead that outboxd refuses postgres.shards > 1 with an error
// naming the version, and returns nil: the caller has nothing more to test
// there (CI never passes a test by skipping it).
func shardDB(t *testing.T) *db {
	t.Helper()
	d := newDB(t)
	if major := serverMajor(t); major < shard.MinVersion {
		checkShardsRefused(t, d, major)
		return nil
	}
	t.Cleanup(func() { dropSlots(t, d) }) // runs before newDB's cleanup
	return d
}

// checkShardsRefused checks that outboxd with two shards exits 1 at start-up
// with an error naming the server's version.
func checkShardsRefused(t *testing.T, d *db, major int) {
	t.Helper()
	p := start(t, shardEnv(d, 2))
	if code := p.waitExit(30 * time.Second); code != 1 {
		t.Errorf("outboxd exited %d, want 1", code)
	}
	p.waitLog(fmt.Sprintf(`sharded slots need publication row filters, which came in Postgres 15; this server is %d`, major), time.Second)
	t.Logf("Postgres %d: outboxd refuses postgres.shards > 1, so there is nothing more to test", major)
}

// dropSlots drops every slot of d's database, ending their holders.
func dropSlots(t *testing.T, d *db) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		_, _ = d.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = current_database() AND active`)
		var left int
		_ = d.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active) s`).Scan(&left)
		var n int
		if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`).Scan(&n); err == nil && n == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("cleanup: slots of %s still there", d.name)
}

// shardEnv is d.env with postgres.shards: n.
func shardEnv(d *db, n int, extra ...string) []string {
	return d.env(append([]string{"OUTBOXD_POSTGRES_SHARDS=" + strconv.Itoa(n)}, extra...)...)
}

// waitShardsStreaming waits until outboxd serves HTTP and each of n shards
// logged that it streams.
func (p *proc) waitShardsStreaming(n int) {
	p.t.Helper()
	p.waitStreaming()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if ok, st := p.status(); ok && (n == 1 || len(st.Shards) == n) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.t.Fatalf("outboxd's %d shards did not all stream within 60s; log:\n%s", n, p.logs.String())
}

type statusJSON struct {
	State  string `json:"state"`
	Slot   string `json:"slot"`
	Shards []struct {
		State        string `json:"state"`
		Slot         string `json:"slot"`
		ConfirmedLSN string `json:"confirmed_lsn"`
	} `json:"shards"`
}

// status reads /readyz: whether it answered 200, and the status JSON.
func (p *proc) status() (bool, statusJSON) {
	var st statusJSON
	resp, err := http.Get("http://" + p.addr + "/readyz")
	if err != nil {
		return false, st
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &st)
	return resp.StatusCode == http.StatusOK, st
}

// Acceptance 1 with shards: the delivery workload of
// TestDeliversExactlyTheCommittedEvents through 2 and 4 shards.
func TestShardsDeliverExactlyTheCommittedEvents(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("shards=%d", n), func(t *testing.T) {
			d := shardDB(t)
			if d == nil {
				return
			}
			p := start(t, shardEnv(d, n))
			p.waitShardsStreaming(n)
			_, st := p.status()
			for i, sh := range st.Shards {
				if want, _ := shard.Name(d.slot, i, n); sh.Slot != want || sh.State != "streaming" {
					t.Errorf("/status shard %d: slot %s state %s, want %s streaming", i, sh.Slot, sh.State, want)
				}
			}
			l, _ := deliverMixedLoad(t, d)
			// Each shard's metrics carry its slot; together they count
			// every insert once.
			mfs, ok := p.scrape()
			if !ok {
				t.Fatal("no /metrics")
			}
			var inserts float64
			for i := range n {
				slot, _ := shard.Name(d.slot, i, n)
				v, ok := seriesValue(mfs, "outboxd_wal_changes_total", map[string]string{"slot": slot, "op": "insert", "table": "public.outbox"})
				if !ok {
					t.Errorf("no outboxd_wal_changes_total{slot=%q}", slot)
				}
				inserts += v
				if _, ok := seriesValue(mfs, "outboxd_slot_lag_bytes", map[string]string{"slot": slot}); !ok {
					t.Errorf("no outboxd_slot_lag_bytes{slot=%q}", slot)
				}
			}
			if inserts != float64(l.committedCount()) {
				t.Errorf("the shards counted %v inserts, want one per committed event, %d", inserts, l.committedCount())
			}
		})
	}
}

// Acceptance 1, kills: 20 SIGKILLs at random moments during the load, with
// 2 and 4 shards, over about a minute each.
func TestShardsSIGKILLAtRandomMoments(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("shards=%d", n), func(t *testing.T) {
			d := shardDB(t)
			if d == nil {
				return
			}
			env := shardEnv(d, n, "OUTBOXD_KAFKA_MAX_BUFFERED_RECORDS=2000", "OUTBOXD_POSTGRES_STATUS_INTERVAL=100ms")
			p := start(t, env)
			p.waitShardsStreaming(n)
			spec := loadSpec{Prefix: d.name, Types: 6, IDs: 60, Writers: 4,
				Events: 24000, TxSizes: []int{1, 2, 10, 1, 5, 3}, RollbackPct: 5, SavepointPct: 10, DeletePct: 20,
				Pace: 15 * time.Millisecond}
			f := startFaultRun(t, d, svc.brokers, spec)
			const kills = 20
			for i := range kills {
				waitCommitted(t, f.l, (i+1)*spec.Events*9/10/(kills+1))
				sleepRand(0, 400*time.Millisecond)
				p.stop(syscall.SIGKILL, 10*time.Second)
				p = start(t, env)
				p.waitShardsStreaming(n)
			}
			r := f.finish(fmt.Sprintf("SIGKILL outboxd with %d shards", n), kills, time.Now(), "")
			if limit := kills * n * (2000 + 5000); r.Duplicates > limit {
				t.Errorf("%d duplicates after %d kills: more than the unacknowledged windows allow (%d)", r.Duplicates, kills, limit)
			}
		})
	}
}

// Acceptance 3 and the logical messages: the application updates and
// deletes outbox rows while 2 shards stream (shard publications publish
// inserts only, so Postgres never asks for a replica identity), and a keyed
// logical message, which every slot receives, is delivered once, by its
// key's shard.
func TestShardsApplicationWritesAndMessages(t *testing.T) {
	d := shardDB(t)
	if d == nil {
		return
	}
	const n = 2
	p := start(t, shardEnv(d, n))
	p.waitShardsStreaming(n)
	topic := d.name + "_w-events"
	ids := []string{uuid(), uuid(), uuid()}
	for i, id := range ids {
		d.exec(t, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, 'Made', '{}')`, id, d.name+"_w", fmt.Sprintf("k-%d", i))
	}
	d.exec(t, `UPDATE outbox SET payload = '{"changed": true}' WHERE id = $1`, ids[0])
	d.exec(t, `DELETE FROM outbox WHERE id = $1`, ids[1])
	msg := func(id, key string) string {
		return fmt.Sprintf(`{"id": "%s", "aggregate_type": "%s_w", "aggregate_id": "%s", "event_type": "Sent", "payload": {}}`, id, d.name, key)
	}
	for i := range 6 {
		d.exec(t, `SELECT pg_logical_emit_message(true, 'outbox', $1)`, msg(fmt.Sprintf("m-%d", i), fmt.Sprintf("mk-%d", i)))
	}
	want := append(append([]string{}, ids...), "m-0", "m-1", "m-2", "m-3", "m-4", "m-5")
	recs := readUntil(t, []string{topic}, time.Minute, 3*time.Second, waitIDs(want...))
	seen := map[string]int{}
	for _, r := range recs {
		seen[header(r, "id")]++
	}
	for _, id := range want {
		if seen[id] != 1 {
			t.Errorf("event %s delivered %d times, want once", id, seen[id])
		}
	}
	if len(recs) != len(want) {
		t.Errorf("read %d records, want %d", len(recs), len(want))
	}
	if ok, st := p.status(); !ok {
		t.Errorf("not ready after the application's writes: %+v", st)
	}
}

// Acceptance 2: changing the shard count by restart while writers write,
// 1 to 2 and 4 to 2, with three SIGKILLs at random moments of the change;
// then back and forth again, cleanly and after a kill.
func TestShardsReshardByRestartDuringLoad(t *testing.T) {
	for _, c := range []struct{ from, to int }{{1, 2}, {4, 2}} {
		t.Run(fmt.Sprintf("%dto%d", c.from, c.to), func(t *testing.T) {
			d := shardDB(t)
			if d == nil {
				return
			}
			env := func(n int) []string {
				return shardEnv(d, n, "OUTBOXD_KAFKA_MAX_BUFFERED_RECORDS=2000", "OUTBOXD_POSTGRES_STATUS_INTERVAL=100ms")
			}
			p := start(t, env(c.from))
			p.waitShardsStreaming(c.from)
			spec := loadSpec{Prefix: d.name, Types: 6, IDs: 60, Writers: 4,
				Events: 12000, TxSizes: []int{1, 2, 10, 1, 5, 3}, RollbackPct: 5, SavepointPct: 10, DeletePct: 20,
				Pace: 15 * time.Millisecond}
			f := startFaultRun(t, d, svc.brokers, spec)
			// The first change: a restart with the new count, killed at
			// a random moment of the reshard, then started again.
			waitCommitted(t, f.l, spec.Events/4)
			if code := p.stop(syscall.SIGTERM, 60*time.Second); code != 0 {
				t.Fatalf("outboxd exited %d after SIGTERM", code)
			}
			// Three kills, each as soon as the reshard (or its resumption)
			// logs a step picked at random (the log is polled every 50 ms,
			// so the kill lands in that step or a little after it).
			steps := []string{"begin", "create", "cutover", "drain", "switch", "drop_old", "advance"}
			for range 3 {
				p = start(t, env(c.to))
				p.waitLog(`msg=resharding step=`+steps[mrand.IntN(len(steps))]+`|msg=streaming`, 30*time.Second)
				p.stop(syscall.SIGKILL, 10*time.Second)
				t.Logf("killed after the reshard steps %v", reshardSteps(p))
			}
			p = start(t, env(c.to))
			p.waitShardsStreaming(c.to)
			t.Logf("resharded %d to %d at %d committed events", c.from, c.to, f.l.committedCount())
			// And back, cleanly, then forward again.
			waitCommitted(t, f.l, spec.Events/2)
			p.stop(syscall.SIGTERM, 60*time.Second)
			p = start(t, env(c.from))
			p.waitShardsStreaming(c.from)
			p.waitLog(`msg=resharded`, time.Second)
			waitCommitted(t, f.l, spec.Events*3/4)
			p.stop(syscall.SIGKILL, 10*time.Second)
			p = start(t, env(c.to))
			p.waitShardsStreaming(c.to)
			f.finish(fmt.Sprintf("reshard %d to %d by restart", c.from, c.to), 4, time.Now(), "")
			var slots []string
			rows, err := d.pool.Query(context.Background(), `SELECT slot_name FROM pg_replication_slots WHERE database = current_database() ORDER BY 1`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var s string
				_ = rows.Scan(&s)
				slots = append(slots, s)
			}
			rows.Close()
			want, _ := shard.Names(d.slot, c.to)
			if fmt.Sprint(slots) != fmt.Sprint(want) {
				t.Errorf("slots after the reshards: %v, want %v", slots, want)
			}
		})
	}
}

// Exactly-once with shards: each shard has its own transactional id and
// position (outboxd-<system id>-<shard's slot>), so shards never fence each
// other; SIGKILLs at random moments and a reshard from 2 to 4 shards by
// restart leave a read_committed consumer with every event once.
func TestShardsExactlyOnce(t *testing.T) {
	d := shardDB(t)
	if d == nil {
		return
	}
	env := func(n int) []string {
		return append(eosEnv(d, "OUTBOXD_KAFKA_MAX_BUFFERED_RECORDS=2000"), "OUTBOXD_POSTGRES_SHARDS="+strconv.Itoa(n))
	}
	p := start(t, env(2))
	p.waitShardsStreaming(2)
	spec := loadSpec{Prefix: d.name, Types: 6, IDs: 60, Writers: 4,
		Events: 16000, TxSizes: []int{1, 2, 10, 1, 5, 3}, RollbackPct: 5, SavepointPct: 10, DeletePct: 20,
		Pace: 15 * time.Millisecond}
	f := startEOSRun(t, d, svc.brokers, spec)
	const kills = 8
	n := 2
	for i := range kills {
		waitCommitted(t, f.l, (i+1)*spec.Events*9/10/(kills+2))
		sleepRand(0, 300*time.Millisecond)
		if i == kills/2 {
			if code := p.stop(syscall.SIGTERM, 60*time.Second); code != 0 {
				t.Fatalf("outboxd exited %d after SIGTERM", code)
			}
			n = 4
			p = start(t, env(n))
			p.waitShardsStreaming(n)
			p.waitLog(`msg=resharded`, time.Second)
			continue
		}
		p.stop(syscall.SIGKILL, 10*time.Second)
		p = start(t, env(n))
		p.waitShardsStreaming(n)
	}
	r := f.finish("exactly-once: SIGKILL outboxd with shards, and a reshard from 2 to 4", kills, time.Now(), "")
	noDuplicates(t, r)
	for i := range n {
		slot, _ := shard.Name(d.slot, i, n)
		if !regexp.MustCompile(`transactional_id=outboxd-\d+-` + slot).MatchString(p.logs.String()) {
			t.Errorf("no transactional id of shard %d (slot %s) in the log", i, slot)
		}
	}
}

var stepRE = regexp.MustCompile(`msg=resharding step=(\S+)`)

// reshardSteps lists the reshard steps p logged.
func reshardSteps(p *proc) []string {
	var out []string
	for _, m := range stepRE.FindAllStringSubmatch(p.logs.String(), -1) {
		out = append(out, m[1])
	}
	return out
}

// outboxd reshard -to M: the same loop as a restart, run by a command that
// exits once the database holds M shards; outboxd then streams them.
func TestShardsReshardCommand(t *testing.T) {
	d := shardDB(t)
	if d == nil {
		return
	}
	p := start(t, shardEnv(d, 1))
	p.waitShardsStreaming(1)
	spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 2,
		Events: 4000, TxSizes: []int{1, 2, 10, 1, 5, 3}, RollbackPct: 5, DeletePct: 20, Pace: 15 * time.Millisecond}
	f := startFaultRun(t, d, svc.brokers, spec)
	waitCommitted(t, f.l, spec.Events/3)
	if code := p.stop(syscall.SIGTERM, 60*time.Second); code != 0 {
		t.Fatalf("outboxd exited %d after SIGTERM", code)
	}
	cmd := start(t, shardEnv(d, 1), "reshard", "-to", "2")
	if code := cmd.waitExit(2 * time.Minute); code != 0 {
		t.Fatalf("outboxd reshard -to 2 exited %d; log:\n%s", code, cmd.logs.String())
	}
	cmd.waitLog(`the slots of "`+d.slot+`" are those of 2 shards`, time.Second)
	p = start(t, shardEnv(d, 2))
	p.waitShardsStreaming(2)
	if steps := reshardSteps(p); len(steps) != 0 {
		t.Errorf("outboxd with 2 shards resharded again after the command: %v", steps)
	}
	f.finish("outboxd reshard -to 2", 1, time.Now(), "")
}

// An HA pair with 2 shards: the second instance stands by on both shards
// (not ready) and takes both over when the first is killed during the load.
func TestShardsHotStandbyTakesOver(t *testing.T) {
	d := shardDB(t)
	if d == nil {
		return
	}
	env := shardEnv(d, 2, "OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=250ms")
	a := start(t, env)
	a.waitShardsStreaming(2)
	b := start(t, env)
	m := listenRE.FindStringSubmatch(b.waitLog(`msg="serving metrics and health" addr=\S+`, 30*time.Second))
	b.addr = m[1]
	body := b.waitReady(503, 30*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, st := b.status()
		if len(st.Shards) == 2 && st.Shards[0].State == "standby" && st.Shards[1].State == "standby" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second instance's shards are not both standbys: %s", body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 2,
		Events: 4000, TxSizes: []int{1, 2, 10, 1, 5, 3}, RollbackPct: 5, DeletePct: 20, Pace: 15 * time.Millisecond}
	f := startFaultRun(t, d, svc.brokers, spec)
	waitCommitted(t, f.l, spec.Events/3)
	a.stop(syscall.SIGKILL, 10*time.Second)
	b.waitReady(200, 30*time.Second)
	f.finish("HA pair with 2 shards, the active one killed", 1, time.Now(), "")
}

// Before Postgres 15 (no publication row filters) postgres.shards > 1 is a
// start-up error that names the server's version; from 15 on the same
// settings stream.
func TestShardsRefusedBeforePostgres15(t *testing.T) {
	d := newDB(t)
	major := serverMajor(t)
	if major < shard.MinVersion {
		checkShardsRefused(t, d, major)
		return
	}
	t.Cleanup(func() { dropSlots(t, d) })
	p := start(t, shardEnv(d, 2))
	p.waitShardsStreaming(2)
}

// insertRows inserts outbox rows of aggregate type typ with the given keys
// ("" for NULL), all in one transaction or each in its own, and returns
// their ids in order.
func insertRows(t *testing.T, d *db, typ string, oneTxn bool, keys ...string) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	var tx pgx.Tx
	for _, k := range keys {
		if tx == nil {
			var err error
			if tx, err = d.pool.Begin(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var key *string
		if k != "" {
			key = &k
		}
		id := uuid()
		if _, err := tx.Exec(ctx, insertSQL, id, typ, key, "Happened", "{}"); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		if !oneTxn {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			tx = nil
		}
	}
	if tx != nil {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// Issue 32 item 1: with shards, a row whose key column is NULL has no hash;
// shard 0's publication takes it, so it reaches a pipeline and
// router.require_key applies as without shards: false delivers it with a
// null key, true halts outboxd with the row's error, and nothing is lost (a
// restart with require_key false then delivers it). Keyed, NULL-keyed and
// keyed rows, in one transaction and in separate ones, with 2 and 4 shards.
func TestShardsNullKeys(t *testing.T) {
	for _, n := range []int{2, 4} {
		for _, c := range []struct {
			name    string
			require bool
			oneTxn  bool
		}{{"require_key=false", false, false}, {"require_key=true/one_txn", true, true}, {"require_key=true/separate_txns", true, false}} {
			t.Run(fmt.Sprintf("shards=%d/%s", n, c.name), func(t *testing.T) {
				d := shardDB(t)
				if d == nil {
					return
				}
				d.exec(t, `ALTER TABLE outbox ALTER COLUMN aggregate_id DROP NOT NULL`)
				env := func(require bool) []string {
					return shardEnv(d, n, "OUTBOXD_ROUTER_REQUIRE_KEY="+strconv.FormatBool(require))
				}
				p := start(t, env(c.require))
				p.waitShardsStreaming(n)
				typ := d.name + "_n"
				var ids, nulls []string
				for _, one := range []bool{true, false} {
					if c.require && one != c.oneTxn {
						continue // the first NULL key halts outboxd
					}
					got := insertRows(t, d, typ, one, "k-1", "", "k-2", "k-3", "", "k-4")
					ids = append(ids, got...)
					nulls = append(nulls, got[1], got[4])
				}
				if c.require {
					if code := p.waitExit(30 * time.Second); code != 1 {
						t.Fatalf("outboxd exited %d on a NULL key with require_key true, want 1", code)
					}
					p.waitLog(`column aggregate_id is NULL; a key is required \(router.require_key\)`, time.Second)
					// Nothing was confirmed past the row: with require_key
					// false it is delivered.
					p = start(t, env(false))
					p.waitShardsStreaming(n)
				}
				recs := readUntil(t, []string{typ + "-events"}, time.Minute, 2*time.Second, waitIDs(ids...))
				seen := map[string]int{}
				for _, r := range recs {
					id := header(r, "id")
					seen[id]++
					if slices.Contains(nulls, id) != (r.Key == nil) {
						t.Errorf("event %s has the key %q", id, r.Key)
					}
				}
				for _, id := range ids {
					if seen[id] == 0 || !c.require && seen[id] != 1 {
						t.Errorf("event %s delivered %d times", id, seen[id])
					}
				}
			})
		}
	}
}

// Issue 32 item 1, existing deployments: shard 0's publication made with
// the filter from before NULL keys had a shard is refused when
// postgres.create_publication is false, with the statement that fixes it,
// and fixed when it is true, with a warning that the rows with a NULL key
// committed before were published to no slot. The fix drops and adds back
// the outbox table alone: another table the user put in shard 0's
// publication stays there (review of issue 35 §1, S2).
func TestShardsStaleNullFilter(t *testing.T) {
	d := shardDB(t)
	if d == nil {
		return
	}
	const n = 2
	d.exec(t, `ALTER TABLE outbox ALTER COLUMN aggregate_id DROP NOT NULL`)
	d.exec(t, `CREATE TABLE public.other (k text)`)
	pubs, _ := shard.Names("outboxd", n)
	for i, pub := range pubs {
		stmt := strings.Replace(shard.PublicationSQL(pub, outboxTable("aggregate_id"), i, n), `"aggregate_id" IS NULL OR `, "", 1)
		if i == 0 {
			stmt = strings.Replace(stmt, " WITH (", `, "public"."other" WITH (`, 1)
		}
		d.exec(t, stmt)
	}
	// In the log the statement is inside a quoted value: its quotes are escaped.
	alter := strings.ReplaceAll(regexp.QuoteMeta(shard.RefilterSQL(pubs[0], outboxTable("aggregate_id"), nil, 0, n)), `"`, `\\"`)
	p := start(t, shardEnv(d, n, "OUTBOXD_POSTGRES_CREATE_PUBLICATION=false"))
	if code := p.waitExit(30 * time.Second); code != 1 {
		t.Fatalf("outboxd exited %d with a stale shard filter and create_publication false, want 1", code)
	}
	p.waitLog(`publishes rows with a NULL key to no shard \(column \\"aggregate_id\\" of \\"public\\".\\"outbox\\" is NULL\), so outboxd never sees such a row: `+alter+` fixes it`, time.Second)
	p.waitLog(`rows with a NULL key committed before then were published to no shard's slot and are lost to outboxd`, time.Second)

	p = start(t, shardEnv(d, n, "OUTBOXD_ROUTER_REQUIRE_KEY=false"))
	p.waitShardsStreaming(n)
	p.waitLog(`msg="fixed the row filter of the shard publication, which published rows with a NULL key to no shard;.*lost to outboxd.* statement="`+alter, time.Second)
	typ := d.name + "_s"
	ids := insertRows(t, d, typ, false, "k-1", "", "k-2")
	recs := readUntil(t, []string{typ + "-events"}, time.Minute, 2*time.Second, waitIDs(ids...))
	if len(recs) != len(ids) {
		t.Errorf("read %d records, want %d", len(recs), len(ids))
	}
	var listed []string
	if err := d.pool.QueryRow(context.Background(), `SELECT array_agg(tablename::text ORDER BY tablename) FROM pg_publication_tables WHERE pubname = $1`, pubs[0]).Scan(&listed); err != nil ||
		fmt.Sprint(listed) != "[other outbox]" {
		t.Errorf("after the fix %s lists %v (%v), want other and outbox", pubs[0], listed, err)
	}
	// Started again, it finds the filter right and changes nothing.
	p.stop(syscall.SIGTERM, 30*time.Second)
	p = start(t, shardEnv(d, n, "OUTBOXD_ROUTER_REQUIRE_KEY=false"))
	p.waitShardsStreaming(n)
	if strings.Contains(p.logs.String(), "fixed the row filter") {
		t.Error("the filter was fixed again")
	}
}

var cutoverRE = regexp.MustCompile(`msg=resharded .*cutover=([0-9A-F]+/[0-9A-F]+)`)

// Issue 32 item 6: the new slots' advance to the cutover X is made durable
// (CHECKPOINT) before the reshard is done. A reshard from 2 to 4 shards in
// exactly-once mode under load (the old instance stopped once the new one
// has made its slots), with Postgres stopped in immediate mode (a crash)
// and outboxd killed right after the "resharded" line: after the restart
// every new slot is at or past X, and a read_committed consumer sees every
// event once.
func TestShardsReshardSurvivesPostgresCrash(t *testing.T) {
	pg := startOwnPostgres(t)
	d := outboxDB(t, pg.dsn)
	d.name, d.slot = "t_shardcrash_"+randomSuffix(), "outboxd_crash"
	if major := serverMajorAt(t, pg.dsn); major < shard.MinVersion {
		checkShardsRefused(t, d, major)
		return
	}
	env := func(n int) []string {
		return append(eosEnv(d, "OUTBOXD_KAFKA_MAX_BUFFERED_RECORDS=2000"), "OUTBOXD_POSTGRES_SHARDS="+strconv.Itoa(n))
	}
	p := start(t, env(2))
	p.waitShardsStreaming(2)
	spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 2, Events: 3000,
		TxSizes: []int{1, 2, 10, 1, 5, 3}, RollbackPct: 5, DeletePct: 20, Pace: 10 * time.Millisecond, Truth: true, Tolerant: true}
	f := startEOSRun(t, d, svc.brokers, spec)
	waitCommitted(t, f.l, spec.Events/3)
	// The new instance creates its slots while the old one streams on, so
	// that the cutover (the old slots' position when it is killed) lies
	// past the last new slot's creation: advancing that slot to it moves
	// no restart_lsn, and Postgres writes it to disk only at a checkpoint.
	p4 := start(t, env(4))
	p4.waitLog(`msg="resharding: waiting"`, time.Minute)
	time.Sleep(2 * time.Second)
	if code := p.stop(syscall.SIGTERM, 60*time.Second); code != 0 {
		t.Fatalf("outboxd exited %d after SIGTERM", code)
	}
	p = p4
	m := cutoverRE.FindStringSubmatch(p.waitLog(cutoverRE.String(), 2*time.Minute))
	pg.stop("immediate")
	p.stop(syscall.SIGKILL, 10*time.Second)
	pg.script("pg-start")
	// The pool's connections died with the server; the first query on one
	// would fail (unexpected EOF) instead of dialling again.
	d.pool.Reset()
	x := parseLSN(t, m[1])
	slots, _ := shard.Names(d.slot, 4)
	for _, s := range slots {
		var lsn string
		if err := d.pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, s).Scan(&lsn); err != nil {
			t.Fatalf("slot %s after the crash: %v", s, err)
		}
		if parseLSN(t, lsn) < x {
			t.Errorf("slot %s is at %s after the crash, before the cutover %s", s, lsn, m[1])
		}
	}
	p = start(t, env(4))
	p.waitShardsStreaming(4)
	r := f.finish("exactly-once: Postgres crash right after a reshard from 2 to 4", 1, time.Now(), "")
	noDuplicates(t, r)
}

var positionReadRE = regexp.MustCompile(`msg="exactly-once: the old shard's position committed in Kafka" .*lsn=(\S+) split_txn=(\S+) .*delivered_to=(\S+) slot=(\S+)`)

// In exactly-once mode a SIGKILLed instance leaves Kafka transactions
// committed past its slots' confirmed positions (a slot confirms a commit
// at the next status update; the position topic holds the truth). A
// reshard from 2 to 4 shards right after the old instance is SIGKILLed
// under load takes its cutover at or past the old shards' positions in
// Kafka, so the new shards, under their own transactional ids, deliver
// none of those events again: a read_committed consumer sees every event
// once. The old instance confirms every 5 s and is killed after two Kafka
// commits that follow a confirmation, so that the kill leaves events
// committed in Kafka and not confirmed to the slots (a hundred duplicates
// and more before the fix).
// With kafka.transaction_max_bytes at its least, large Postgres
// transactions are split over Kafka transactions and the kill mostly
// leaves a position inside one (it says so when not): the cutover is then
// that transaction's end, and the old shard delivers the rest of it.
func TestShardsReshardAfterExactlyOnceSIGKILL(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sizes  []int
		pace   time.Duration
		extra  []string
		events int
	}{
		{"small transactions", []int{1, 2, 10, 1, 5, 3}, 20 * time.Millisecond, nil, 6000},
		{"split transactions", []int{60, 1, 90, 5}, 120 * time.Millisecond, []string{"OUTBOXD_KAFKA_TRANSACTION_MAX_BYTES=1024"}, 8000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := shardDB(t)
			if d == nil {
				return
			}
			env := func(n int, extra ...string) []string {
				extra = append(append([]string{"OUTBOXD_KAFKA_MAX_BUFFERED_RECORDS=2000", "OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=100ms"}, tc.extra...), extra...)
				return append(eosEnv(d, extra...), "OUTBOXD_POSTGRES_SHARDS="+strconv.Itoa(n))
			}
			// The old instance confirms every 5 s only (by default it
			// confirms within 50 ms of Kafka's acknowledgement), and is
			// killed once it has committed two Kafka transactions after a
			// confirmation: its positions in Kafka are then ahead of its
			// slots, the case under test.
			p := start(t, env(2, "OUTBOXD_POSTGRES_STATUS_INTERVAL=5s", "OUTBOXD_POSTGRES_CONFIRM_INTERVAL=5s"))
			p.waitShardsStreaming(2)
			// The new instance makes its slots and waits for the old ones
			// to be idle; the load starts after that.
			p4 := start(t, env(4))
			p4.waitLog(`msg="resharding: waiting"`, time.Minute)
			// The old slots confirm past the new slots' creation (with the
			// keepalives of the idle stream) before the load starts: the
			// old instance's positions in Kafka, further on, then set the
			// cutover, not the new slots' consistent points.
			var created string
			nu, _ := shard.Names(d.slot, 4)
			if err := d.pool.QueryRow(context.Background(), `SELECT max(confirmed_flush_lsn)::text FROM pg_replication_slots WHERE slot_name = ANY($1)`, nu).Scan(&created); err != nil {
				t.Fatalf("the new slots: %v", err)
			}
			old, _ := shard.Names(d.slot, 2)
			oldConfirmed := func() string {
				var lsns string
				if err := d.pool.QueryRow(context.Background(), `SELECT string_agg(confirmed_flush_lsn::text, ',' ORDER BY slot_name) FROM pg_replication_slots WHERE slot_name = ANY($1)`, old).Scan(&lsns); err != nil {
					t.Fatalf("the old slots: %v", err)
				}
				return lsns
			}
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
				var behind int
				if err := d.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY($1) AND confirmed_flush_lsn <= $2::pg_lsn`, old, created).Scan(&behind); err != nil {
					t.Fatalf("the old slots: %v", err)
				}
				if behind == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the old slots did not confirm past the new slots' creation at %s within a minute", created)
				}
			}
			spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 2, Events: tc.events,
				TxSizes: tc.sizes, RollbackPct: 5, DeletePct: 20, Pace: tc.pace}
			f := startEOSRun(t, d, svc.brokers, spec)
			waitCommitted(t, f.l, spec.Events/5)
			// The kill: once the old instance has committed two Kafka
			// transactions after a confirmation (the first may have ended
			// before it), well before the next confirmation, 5 s later.
			before := oldConfirmed()
			for deadline := time.Now().Add(time.Minute); oldConfirmed() == before; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the old slots confirmed nothing past %s in a minute under load", before)
				}
			}
			committed := func() float64 {
				mfs, ok := p.scrape()
				if !ok {
					t.Fatal("the old instance's /metrics did not answer")
				}
				return familySum(mfs, "outboxd_sink_transactions_committed_total")
			}
			c0 := committed()
			for deadline := time.Now().Add(time.Minute); committed() < c0+2; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the old instance committed fewer than 2 Kafka transactions in a minute under load")
				}
			}
			if f.l.committedCount() >= spec.Events*9/10 {
				t.Fatalf("the load had nearly ended (%d of %d events) before the kill: the kill must come under load", f.l.committedCount(), spec.Events)
			}
			p.stop(syscall.SIGKILL, 10*time.Second)
			killed := time.Now()
			t.Logf("killed the old instance at %d of %d events committed", f.l.committedCount(), spec.Events)
			// The old slots' confirmed positions as the kill left them (the
			// cutover is taken a poll later, the drain moves them after it).
			confirmed := map[string]string{}
			for _, s := range old {
				var lsn string
				if err := d.pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, s).Scan(&lsn); err != nil {
					t.Fatalf("slot %s: %v", s, err)
				}
				confirmed[s] = lsn
			}
			p4.waitLog(`msg=resharded`, time.Minute)
			p4.waitShardsStreaming(4)
			ahead, split := 0, 0
			for _, m := range positionReadRE.FindAllStringSubmatch(p4.logs.String(), -1) {
				if m[2] != "0/0" {
					split++
				}
				t.Logf("old shard %s: slot confirmed %s at the kill, position in Kafka %s (split transaction %s), delivered to %s",
					m[4], confirmed[m[4]], m[1], m[2], m[3])
				if c, ok := confirmed[m[4]]; ok && parseLSN(t, m[3]) > parseLSN(t, c) {
					ahead++
				}
			}
			if ahead == 0 {
				t.Error("no old shard's position in Kafka was past its slot's confirmed position after the kill: the case was not exercised")
			}
			if tc.extra != nil && split == 0 {
				// Most runs leave one; a kill between two Postgres
				// transactions leaves none, and the run is the small case.
				t.Log("no old shard's position in Kafka was inside a split transaction this time")
			}
			if m := cutoverRE.FindStringSubmatch(p4.logs.String()); m != nil {
				t.Logf("cutover %s", m[1])
			}
			r := f.finish("exactly-once: SIGKILL of the old instance under load, then a reshard from 2 to 4 ("+tc.name+")", 1, killed, "")
			noDuplicates(t, r)
		})
	}
}

// Issue 32 item 5: an instance configured for the old shard count (the
// other of an HA pair, or the old pod of a rolling update) may take an old
// slot after the cutover X is recorded; it must never stream it past X.
// An HA pair on 2 shards (the standby paused), a third instance on 4 that
// records X once the active one is killed and is killed itself right
// after; the standby, resumed, takes the old slots; a fourth instance
// finishes the reshard. In exactly-once mode under load: no old slot
// confirms past X, the standby says why it stops there, and a
// read_committed consumer sees every event once.
func TestShardsOldInstanceStopsAtTheCutover(t *testing.T) {
	d := shardDB(t)
	if d == nil {
		return
	}
	env := func(n int) []string {
		return append(eosEnv(d, "OUTBOXD_KAFKA_MAX_BUFFERED_RECORDS=2000", "OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=100ms"),
			"OUTBOXD_POSTGRES_SHARDS="+strconv.Itoa(n))
	}
	a := start(t, env(2))
	a.waitShardsStreaming(2)
	b := start(t, env(2))
	b.waitLog(`msg="standby: another process holds the slot`, 30*time.Second)
	spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 2, Events: 4000,
		TxSizes: []int{1, 2, 10, 1, 5, 3}, RollbackPct: 5, DeletePct: 20, Pace: 10 * time.Millisecond}
	f := startEOSRun(t, d, svc.brokers, spec)
	waitCommitted(t, f.l, spec.Events/4)

	// The old slots' highest confirmed positions, sampled until they are dropped.
	old, _ := shard.Names(d.slot, 2)
	var mu sync.Mutex
	highest := map[string]uint64{}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			rows, err := d.pool.Query(context.Background(), `SELECT slot_name, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = ANY($1)`, old)
			if err != nil {
				continue
			}
			var name, lsn string
			_, _ = pgx.ForEachRow(rows, []any{&name, &lsn}, func() error {
				var hi, lo uint64
				if _, err := fmt.Sscanf(lsn, "%X/%X", &hi, &lo); err == nil {
					mu.Lock()
					highest[name] = max(highest[name], hi<<32|lo)
					mu.Unlock()
				}
				return nil
			})
		}
	}()
	_ = b.cmd.Process.Signal(syscall.SIGSTOP)
	c := start(t, env(4))
	c.waitLog(`msg="resharding: waiting"`, time.Minute)
	a.stop(syscall.SIGKILL, 10*time.Second)
	// As soon as the cutover is recorded, the resharding instance dies.
	var x string
	deadline := time.Now().Add(time.Minute)
	for x == "" {
		_ = d.pool.QueryRow(context.Background(), `SELECT coalesce(cutover::text, '') FROM outboxd_reshard WHERE phase = 'draining'`).Scan(&x)
		if time.Now().After(deadline) {
			t.Fatal("no cutover recorded within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.stop(syscall.SIGKILL, 10*time.Second)
	_ = b.cmd.Process.Signal(syscall.SIGCONT)
	// The old standby takes the old slots; it may deliver up to X.
	time.Sleep(3 * time.Second)
	c = start(t, env(4))
	c.waitLog(`msg=resharded`, 2*time.Minute)
	close(stop)
	<-sampled
	for _, s := range old {
		if highest[s] > parseLSN(t, x) {
			t.Errorf("old slot %s confirmed %X/%X, past the cutover %s", s, highest[s]>>32, uint32(highest[s]), x)
		}
	}
	t.Logf("cutover %s; the old slots' highest confirmed positions %v", x, highest)
	if strings.Contains(b.logs.String(), "an old shard delivered a transaction that ends after the reshard's cutover") {
		t.Error("the old standby delivered past the cutover")
	}
	c.waitShardsStreaming(4)
	r := f.finish("exactly-once: HA pair on 2 shards, an instance on 4 records the cutover and dies, the old standby takes the old slots", 2, time.Now(), "")
	noDuplicates(t, r)
	t.Logf("the old standby: %v", reshardWaits(b))
}

var waitRE = regexp.MustCompile(`msg="not streaming the slot: a reshard is under way" .*reason="([^"]*)`)

// reshardWaits lists the reasons p gave for not streaming a slot.
func reshardWaits(p *proc) []string {
	var out []string
	for _, m := range waitRE.FindAllStringSubmatch(p.logs.String(), -1) {
		out = append(out, m[1])
	}
	return out
}
