package reshard_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/reshard"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/wal"
)

// TxnEnd finds the end LSN of a transaction by its commit LSN in an idle
// slot, without moving the slot: the end Postgres reports for the
// transaction's commit (the lsn column of its Commit row), past its commit
// record and at or before the next transaction's. A commit LSN the slot
// does not hold is not found. It needs the test bed's Postgres.
func TestTxnEnd(t *testing.T) {
	_, dsn := testenv.NewDatabase(t, "txnend")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`CREATE TABLE outbox (id bigserial PRIMARY KEY, payload text)`,
		`CREATE PUBLICATION pub FOR TABLE outbox`,
		`SELECT pg_create_logical_replication_slot('s', 'pgoutput')`,
		`INSERT INTO outbox (payload) VALUES ('a')`,
		`INSERT INTO outbox (payload) SELECT 'b' FROM generate_series(1, 100)`,
		`INSERT INTO outbox (payload) VALUES ('c')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var before string
	if err := conn.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 's'`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	// The three transactions' commit LSNs (from their Begin messages) and
	// ends (the lsn of their Commit rows), in commit order.
	rows, err := conn.Query(ctx, `SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL, 'proto_version', '1', 'publication_names', 'pub')
		WHERE get_byte(data, 0) IN (66, 67)`)
	if err != nil {
		t.Fatal(err)
	}
	var commits, ends []pglogrepl.LSN
	var lsn string
	var data []byte
	if _, err := pgx.ForEachRow(rows, []any{&lsn, &data}, func() error {
		m, err := pglogrepl.Parse(data)
		if err != nil {
			return err
		}
		switch m := m.(type) {
		case *pglogrepl.BeginMessage:
			commits = append(commits, m.FinalLSN)
		case *pglogrepl.CommitMessage:
			l, err := pglogrepl.ParseLSN(lsn)
			if err != nil {
				return err
			}
			ends = append(ends, l)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(commits) != 3 || len(ends) != 3 {
		t.Fatalf("commits %v, ends %v; want three transactions", commits, ends)
	}
	db := &reshard.PG{Conn: conn}
	for i := range commits {
		end, ok, err := db.TxnEnd(ctx, "s", "pub", commits[i])
		if err != nil || !ok || end != ends[i] {
			t.Errorf("TxnEnd(%s) = %s, %v, %v; want %s", commits[i], end, ok, err, ends[i])
		}
		if end <= commits[i] || i+1 < len(commits) && end > commits[i+1] {
			t.Errorf("transaction %d: end %s is not past its commit %s and before the next", i, end, commits[i])
		}
	}
	if _, ok, err := db.TxnEnd(ctx, "s", "pub", commits[1]+1); err != nil || ok {
		t.Errorf("TxnEnd of no transaction's commit: ok %v, err %v; want not found", ok, err)
	}
	var after string
	if err := conn.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 's'`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("the slot moved from %s to %s", before, after)
	}
}

// Second review of issue 35 §1, S2: right before the cutover (no fix), a
// new shard's publication that does not exist is refused, not made after
// the new slots, for a single shard too (its publication dropped by hand),
// whatever postgres.create_publication says; every missing one is named
// in one refusal. It needs the test bed's Postgres.
func TestCreatePublicationsMissingBeforeTheCutover(t *testing.T) {
	ctx := context.Background()
	conn := testenv.Connect(t, "newpubs", `CREATE TABLE outbox (id bigserial PRIMARY KEY, k text)`)
	db := &reshard.PG{Conn: conn, Cfg: config.Postgres{Publication: "outboxd", CreatePublication: true},
		Tables: []shard.Table{{Schema: "public", Name: "outbox", KeyColumn: "k"}}}
	for _, names := range [][]string{{"outboxd"}, {"outboxd_0of2", "outboxd_1of2"}} {
		err := db.CreatePublications(ctx, names, false)
		var perm *reshard.PermanentError
		if !errors.As(err, &perm) {
			t.Errorf("%v: CreatePublications = %v, want a refusal", names, err)
		}
		for _, name := range names {
			if err != nil && !strings.Contains(err.Error(), `publication "`+name+`" of new shard`) {
				t.Errorf("%v: the refusal does not name %s: %v", names, name, err)
			}
			var made bool
			if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)`, name).Scan(&made); err != nil || made {
				t.Errorf("publication %s made after the new slots (%v)", name, err)
			}
		}
	}
}

// Second review of issue 35 §1, S3: before the cutover a new shard's
// publication is checked for more than its tables and filters: it must
// publish inserts, publish a partitioned outbox table via its root (else
// each partition's own filter, none, applies; Postgres refuses a filter on
// the root then, so it is listed without one), and have no column list
// that leaves out a column the router reads. Each is refused with the
// statement that puts it right; with fix and create_publication it is put
// right. It needs the test bed's Postgres.
func TestNewPublicationOptionsChecked(t *testing.T) {
	ctx := context.Background()
	conn := testenv.Connect(t, "newpubopts", `CREATE TABLE outbox (id bigserial PRIMARY KEY, k text, payload text);
		CREATE TABLE parts (k text, payload text) PARTITION BY LIST (k); CREATE TABLE parts_a PARTITION OF parts DEFAULT`)
	filter := shard.Filter("k", 1, 2)
	tests := []struct {
		name, table, create, want string
	}{
		{"publish", "outbox", `FOR TABLE public.outbox WHERE (` + filter + `) WITH (publish = 'update')`,
			`does not publish INSERTs.*ALTER PUBLICATION "outboxd_1of2" SET \(publish = 'insert', publish_via_partition_root = true\)`},
		{"via root", "parts", `FOR TABLE public.parts WITH (publish = 'insert', publish_via_partition_root = false)`,
			`"public"."parts" are partitioned .*every shard would deliver them.*ALTER PUBLICATION "outboxd_1of2" SET \(publish = 'insert', publish_via_partition_root = true\)`},
		{"column list", "outbox", `FOR TABLE public.outbox (id, k) WHERE (` + filter + `) WITH (publish = 'insert')`,
			`column list of "public"."outbox" leaves out payload, which outboxd reads.*ALTER PUBLICATION "outboxd_1of2" DROP TABLE "public"."outbox"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := conn.Exec(ctx, `DROP PUBLICATION IF EXISTS outboxd_1of2; CREATE PUBLICATION outboxd_1of2 `+tt.create); err != nil {
				t.Fatal(err)
			}
			db := &reshard.PG{Conn: conn, Cfg: config.Postgres{Publication: "outboxd", CreatePublication: true},
				Tables: []shard.Table{{Schema: "public", Name: tt.table, KeyColumn: "k"}}, Reads: [][]string{{"k", "payload"}}}
			err := db.CreatePublications(ctx, []string{"outboxd_1of2"}, false)
			if err == nil || !regexp.MustCompile(tt.want).MatchString(err.Error()) {
				t.Fatalf("CreatePublications = %v, want a refusal matching %s", err, tt.want)
			}
			if err := db.CreatePublications(ctx, []string{"outboxd_1of2"}, true); err != nil {
				t.Fatalf("with fix: %v", err)
			}
			if err := db.CreatePublications(ctx, []string{"outboxd_1of2"}, false); err != nil {
				t.Errorf("after the fix: %v", err)
			}
		})
	}
}

// Second review of issue 35 §1, S4: wrong row filters in several shard
// publications (router.key_column changed at 2 shards) are refused with
// one transaction that re-filters every one of them: put right one
// publication at a time, a row whose two key columns hash to different
// shards would reach both, or neither, in between. Run as printed, the
// publications pass. It needs the test bed's Postgres.
func TestWrongFiltersRefusedWithOneTransaction(t *testing.T) {
	ctx := context.Background()
	conn := testenv.Connect(t, "wrongfilters", `CREATE TABLE outbox (k text, old_key text)`)
	old := []shard.Table{{Schema: "public", Name: "outbox", KeyColumn: "old_key"}}
	var shards []shard.Shard
	for i := range 2 {
		name, _ := shard.Name("outboxd", i, 2)
		if _, err := conn.Exec(ctx, shard.PublicationSQL(name, old, i, 2)); err != nil {
			t.Fatal(err)
		}
		shards = append(shards, shard.Shard{Index: i, Count: 2, Slot: name, Publication: name})
	}
	db := &reshard.PG{Conn: conn, Cfg: config.Postgres{Publication: "outboxd", CreatePublication: true},
		Tables: []shard.Table{{Schema: "public", Name: "outbox", KeyColumn: "k"}}}
	err := db.EnsureShardPublications(ctx, shards)
	if err == nil {
		t.Fatal("wrong filters passed")
	}
	t.Logf("refused: %v", err)
	stmt := regexp.MustCompile(`BEGIN; .*?COMMIT;`).FindString(err.Error())
	if strings.Count(err.Error(), "BEGIN;") != 1 || !strings.Contains(stmt, `"outboxd_0of2"`) || !strings.Contains(stmt, `"outboxd_1of2"`) {
		t.Fatalf("refusal %v: want one transaction re-filtering both publications", err)
	}
	if _, err := conn.Exec(ctx, stmt); err != nil {
		t.Fatalf("running %s: %v", stmt, err)
	}
	if err := db.EnsureShardPublications(ctx, shards); err != nil {
		t.Errorf("after the printed transaction: %v", err)
	}
}

// Second review of issue 35 §1, S6: a table that some shard publications
// list already (an earlier ADD TABLE of one of them) is refused with the
// transaction that adds it to the others, and the refusal does not say
// that its rows written before reached no shard: those shards have them.
// It needs the test bed's Postgres.
func TestMissingTableListedByOneShard(t *testing.T) {
	ctx := context.Background()
	conn := testenv.Connect(t, "partlyadded", `CREATE TABLE outbox (k text); CREATE TABLE events (k text)`)
	tables := []shard.Table{{Schema: "public", Name: "outbox", KeyColumn: "k"}, {Schema: "public", Name: "events", KeyColumn: "k"}}
	var shards []shard.Shard
	for i, listed := range [][]shard.Table{tables, tables[:1]} {
		name, _ := shard.Name("outboxd", i, 2)
		if _, err := conn.Exec(ctx, shard.PublicationSQL(name, listed, i, 2)); err != nil {
			t.Fatal(err)
		}
		shards = append(shards, shard.Shard{Index: i, Count: 2, Slot: name, Publication: name})
	}
	db := &reshard.PG{Conn: conn, Cfg: config.Postgres{Publication: "outboxd", Slot: "outboxd", CreatePublication: true}, Tables: tables}
	err := db.EnsureShardPublications(ctx, shards)
	if err == nil || !strings.Contains(err.Error(), shard.AddTableSQL("outboxd_1of2", tables[1], 1, 2)+".") ||
		strings.Contains(err.Error(), "are published to no shard") || !strings.Contains(err.Error(), "published only by the shard publications that list them already") {
		t.Errorf("EnsureShardPublications = %v; want the ADD TABLE for outboxd_1of2 alone, and that outboxd_0of2 published the rows before", err)
	}
}

// A transaction open across the operator's fix of a new shard's
// publication, which the Cutover check's refusal prints: its rows written
// before the fix are decoded by the new slot with the catalogue of before
// the fix, so the cutover must lie past its commit, where the old shards
// deliver it whole (third review of issue 35 §1, M1). This runs Run's
// Cutover step: the refusal, the printed statement, the check passing,
// CutoverLSN; the transaction writes again and commits while CutoverLSN
// waits.
func TestCutoverAfterATransactionOpenAcrossTheFix(t *testing.T) {
	for _, tt := range []struct{ name, create string }{
		{"missing table", `FOR TABLE other WITH (publish = 'insert', publish_via_partition_root = true)`},
		{"publish update", `FOR TABLE outbox WHERE (` + shard.Filter("k", 1, 2) + `) WITH (publish = 'update', publish_via_partition_root = true)`},
	} {
		t.Run(tt.name, func(t *testing.T) { openAcrossTheFix(t, tt.create) })
	}
}

func openAcrossTheFix(t *testing.T, create string) {
	ctx := context.Background()
	conn := testenv.Connect(t, "inflight", `CREATE TABLE outbox (id bigserial PRIMARY KEY, k text); CREATE TABLE other (id int)`)
	var key string // of shard 1 of 2
	if err := conn.QueryRow(ctx, `SELECT k FROM (SELECT chr(97 + g) AS k FROM generate_series(0, 25) g) v WHERE `+shard.Filter("k", 1, 2)+` LIMIT 1`).Scan(&key); err != nil {
		t.Fatal(err)
	}
	// The new shard's publication made wrong by hand, its slot made.
	for _, q := range []string{
		`CREATE PUBLICATION outboxd_1of2 ` + create,
		`SELECT pg_create_logical_replication_slot('outboxd_1of2', 'pgoutput')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	db := &reshard.PG{Conn: conn, Cfg: config.Postgres{Publication: "outboxd", Slot: "outboxd", CreatePublication: true},
		Tables: []shard.Table{{Schema: "public", Name: "outbox", KeyColumn: "k"}}, Log: testenv.Logger(t)}

	tx := openTx(t, conn, `INSERT INTO outbox (k) VALUES ($1)`, key)
	err := db.CreatePublications(ctx, []string{"outboxd_1of2"}, false)
	if err == nil {
		t.Fatal("the wrong publication passed")
	}
	t.Logf("refused: %v", err)
	stmt := regexp.MustCompile(`(ALTER PUBLICATION .*?|BEGIN; .*?COMMIT;)(?: puts it right|\. Rows of them)`).FindStringSubmatch(err.Error())
	if stmt == nil {
		t.Fatalf("no statement in %v", err)
	}
	if _, err := conn.Exec(ctx, stmt[1]); err != nil {
		t.Fatal(err)
	}
	if err := db.CreatePublications(ctx, []string{"outboxd_1of2"}, false); err != nil {
		t.Fatalf("after the fix: %v", err)
	}
	// The transaction writes one more row and commits while the cutover
	// is taken.
	done := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (k) VALUES ($1)`, key); err != nil {
			done <- err
			return
		}
		done <- tx.Commit(ctx)
	}()
	x, err := db.CutoverLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// The new shard delivers the transactions that commit past X.
	rows, err := conn.Query(ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes('outboxd_1of2', NULL, NULL, 'proto_version', '1', 'publication_names', 'outboxd_1of2')`)
	if err != nil {
		t.Fatal(err)
	}
	var data []byte
	var final pglogrepl.LSN
	inserts := 0
	if _, err := pgx.ForEachRow(rows, []any{&data}, func() error {
		m, err := pglogrepl.Parse(data)
		if err != nil {
			return err
		}
		switch m := m.(type) {
		case *pglogrepl.BeginMessage:
			final = m.FinalLSN
		case *pglogrepl.InsertMessage:
			inserts++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("cutover %s, the transaction commits at %s", x, final)
	if final > x && inserts != 2 {
		t.Errorf("the transaction open across the fix commits at %s, past the cutover %s, and the new shard delivers %d of its 2 rows: the old shards stop at the cutover, so %d are lost", final, x, inserts, 2-inserts)
	}
}

// openTx begins a transaction on a connection of its own to conn's
// database and runs q in it; the test rolls it back at its end unless it
// ended.
func openTx(t *testing.T, conn *pgx.Conn, q string, args ...any) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	app, err := pgx.Connect(ctx, conn.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { app.Close(ctx) })
	tx, err := app.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, q, args...); err != nil {
		t.Fatal(err)
	}
	return tx
}

// CutoverLSN's wait for an open transaction ends with its context.
func TestCutoverLSNWaitEndsWithItsContext(t *testing.T) {
	conn := testenv.Connect(t, "cutoverwait", `CREATE TABLE outbox (k text)`)
	openTx(t, conn, `INSERT INTO outbox VALUES ('a')`)
	db := &reshard.PG{Conn: conn, Cfg: config.Postgres{Publication: "outboxd", Slot: "outboxd"}, Log: testenv.Logger(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if x, err := db.CutoverLSN(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("CutoverLSN with a transaction open: %s, %v; want it to wait until its context ends", x, err)
	}
}

// Third review of issue 35 §1, M2: a table added to postgres.tables after
// the new slots were made is refused at the cutover's check with the one
// transaction that adds it to the publications of both shard counts
// (refuseMissing): the old shards deliver its rows up to the cutover,
// which the start after the fix records. It needs the test bed's Postgres.
func TestCutoverCheckAddsAMissingTableToBothCounts(t *testing.T) {
	conn, db, _ := resharding(t, "cutadd", 2, 3, nil)
	names, _ := shard.Names("outboxd", 3)
	refusedWithBothCounts(t, conn, db, names, false, `"outboxd_0of2"`, `"outboxd_2of3"`)
}

// Fourth review of issue 35 §1, M1: resharding down to one shard, a table
// the new publication "outboxd" lacks is refused at the cutover's check
// with the transaction over the publications of both counts, not with an
// ALTER of "outboxd" alone: the old shards' publications lack it too, and
// they deliver every row up to the cutover. The transaction runs as
// printed. It needs the test bed's Postgres.
func TestCutoverToOneShardAddsAMissingTableToBothCounts(t *testing.T) {
	conn, db, _ := resharding(t, "cutdown", 2, 1, nil)
	refusedWithBothCounts(t, conn, db, []string{"outboxd"}, false, `"outboxd_0of2"`, `"outboxd_1of2"`, `ALTER PUBLICATION "outboxd" ADD TABLE "public"."events";`)
}

// The same from one shard (1 -> 2): the transaction adds the table to the
// old shard's publication "outboxd" unfiltered. It needs the test bed's
// Postgres.
func TestCutoverFromOneShardAddsAMissingTableToBothCounts(t *testing.T) {
	conn, db, _ := resharding(t, "cutup", 1, 2, nil)
	names, _ := shard.Names("outboxd", 2)
	refusedWithBothCounts(t, conn, db, names, false, `"outboxd_1of2"`, `ALTER PUBLICATION "outboxd" ADD TABLE "public"."events";`)
}

// refusedWithBothCounts checks that the check of the new publications
// names (at Create with fix, else at the cutover) refuses a table no
// publication lists with one transaction that says each of want and runs
// as printed, after which the check passes.
func refusedWithBothCounts(t *testing.T, conn *pgx.Conn, db *reshard.PG, names []string, fix bool, want ...string) {
	t.Helper()
	ctx := context.Background()
	err := db.CreatePublications(ctx, names, fix)
	if err == nil {
		t.Fatal("a table no publication lists passed")
	}
	t.Logf("refused: %v", err)
	stmt := regexp.MustCompile(`BEGIN; .*?COMMIT;`).FindString(err.Error())
	for _, w := range want {
		if !strings.Contains(stmt, w) {
			t.Errorf("the transaction %q does not say %s", stmt, w)
		}
	}
	for _, w := range []string{"before the application first writes", "published to no shard"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the refusal does not say %s", w)
		}
	}
	if stmt == "" || strings.Count(err.Error(), stmt) != 1 {
		t.Fatalf("the transaction is named %d times, want once", strings.Count(err.Error(), stmt))
	}
	if _, err := conn.Exec(ctx, stmt); err != nil {
		t.Fatal(err)
	}
	if err := db.CreatePublications(ctx, names, fix); err != nil {
		t.Errorf("after the printed transaction: %v", err)
	}
}

// Fourth review of issue 35 §1, S1: at Create, a table the old shards'
// publications lack is refused with the transaction over both counts
// before anything is made or put right, not added to the new shards'
// publications alone (their rows up to the cutover would reach no shard,
// and the first word of it would come from the drain). It needs the test
// bed's Postgres.
func TestCreateRefusesATableTheOldShardsLack(t *testing.T) {
	conn, db, _ := resharding(t, "createold", 2, 3, nil)
	names, _ := shard.Names("outboxd", 3)
	refusedWithBothCounts(t, conn, db, names, true, `"outboxd_0of2"`, `"outboxd_1of2"`, `"outboxd_2of3"`)
}

// While a reshard is recorded, a table the new shards' publications list
// and the old ones' do not had its rows written so far published to no
// shard: the new shards deliver only past the cutover (third review of
// issue 35 §1, M2). It needs the test bed's Postgres.
func TestMissingTableListedByTheNewShardsOnly(t *testing.T) {
	_, db, old := resharding(t, "newonly", 2, 3, func(n int) bool { return n == 3 })
	err := db.EnsureShardPublications(context.Background(), old)
	if err == nil || strings.Contains(err.Error(), "list them already") || !strings.Contains(err.Error(), "published to no shard") {
		t.Errorf("EnsureShardPublications of the old shards = %v; want the rows before the fix published to no shard", err)
	}
}

// Fourth review of issue 35 §1, S2: once the cutover is recorded, the
// refusal of a table the old shards' publications lack and the new ones'
// list says that the new shards deliver its rows past the cutover, and
// names it, rather than sending every row before the fix to a replay,
// which would repeat those. It needs the test bed's Postgres.
func TestMissingTableAfterTheCutoverListedByTheNewShards(t *testing.T) {
	conn, db, old := resharding(t, "drainnew", 2, 3, func(n int) bool { return n == 3 })
	ctx := context.Background()
	var cutover string
	if err := conn.QueryRow(ctx, `UPDATE public.outboxd_reshard SET phase = 'draining', cutover = pg_current_wal_insert_lsn() RETURNING cutover::text`).Scan(&cutover); err != nil {
		t.Fatal(err)
	}
	err := db.EnsureShardPublications(ctx, old)
	if err == nil {
		t.Fatal("the old shards' publications lack events, and EnsureShardPublications passed")
	}
	t.Logf("refused: %v", err)
	if strings.Contains(err.Error(), "published to no shard") {
		t.Errorf("the refusal says the rows before the fix reached no shard; the new shards deliver those past the cutover")
	}
	for _, want := range []string{"cutover at " + cutover, "the 3 new shards deliver them", "no shard delivers them (the 2 old"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q", want)
		}
	}
}

// resharding makes a database with the outbox tables outbox and events,
// a reshard from shards to shards recorded (creating) and the
// publications of both counts (one shard's unsharded, as outboxd makes
// it), listing events where lists(count): a table added to
// postgres.tables during the reshard. It returns the PG and the old
// shards.
func resharding(t *testing.T, prefix string, from, to int, lists func(n int) bool) (*pgx.Conn, *reshard.PG, []shard.Shard) {
	t.Helper()
	ctx := context.Background()
	conn := testenv.Connect(t, prefix, `CREATE TABLE outbox (k text); CREATE TABLE events (k text)`)
	tables := []shard.Table{{Schema: "public", Name: "outbox", KeyColumn: "k"}, {Schema: "public", Name: "events", KeyColumn: "k"}}
	var old []shard.Shard
	for _, n := range []int{from, to} {
		listed := tables[:1]
		if lists != nil && lists(n) {
			listed = tables
		}
		for i := range n {
			name, _ := shard.Name("outboxd", i, n)
			q := shard.PublicationSQL(name, listed, i, n)
			if n == 1 {
				q = wal.PublicationOfSQL(name, walTables(listed))
			}
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
			if n == from {
				old = append(old, shard.Shard{Index: i, Count: n, Slot: name, Publication: name})
			}
		}
	}
	for _, q := range []string{shard.StateTableSQL("public"),
		`INSERT INTO public.outboxd_reshard (slot, from_shards, to_shards, phase) VALUES ('outboxd', $1, $2, 'creating')`} {
		var args []any
		if strings.HasPrefix(q, "INSERT") {
			args = []any{from, to}
		}
		if _, err := conn.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	return conn, &reshard.PG{Conn: conn, Cfg: config.Postgres{Publication: "outboxd", Slot: "outboxd", Table: "public.outbox", CreatePublication: true}, Tables: tables}, old
}

// walTables are tables as package wal names them.
func walTables(tables []shard.Table) []wal.Table {
	out := make([]wal.Table, len(tables))
	for i, t := range tables {
		out[i] = wal.Table{Schema: t.Schema, Name: t.Name}
	}
	return out
}
