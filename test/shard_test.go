package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/wal"
)

// shardKeys are the keys whose shard Postgres and shard.Of must agree on:
// ASCII, multibyte UTF-8, the empty string, SQL and identifier metacharacters,
// uuids as text, long strings and 1,000 random ones (seed logged).
func shardKeys(t *testing.T) []string {
	keys := []string{
		"", "a", "b", "A", " ", "order-1", "order-2", "customer:42", "trailing  ", " leading",
		`quote'`, `double"quote`, `back\slash`, "new\nline", "tab\t", "%", "_",
		"ключ", "日本語のキー", "emoji 🎉🚀", "e\u0301", "ß", "ﬀ", "\u00a0", "\U0010FFFF",
	}
	for range 50 {
		keys = append(keys, uuid(), strings.ToUpper(uuid()))
	}
	keys = append(keys, strings.Repeat("x", 10_000), strings.Repeat("ж", 100_000), strings.Repeat("0123456789", 100_000))
	seed := rand.Uint64()
	t.Logf("random keys from seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 28))
	ranges := [][2]rune{{0x20, 0x7e}, {0xa0, 0xff}, {0x400, 0x4ff}, {0x4e00, 0x9fff}, {0x1f300, 0x1f6ff}, {1, 0x1f}}
	for range 1000 {
		var b strings.Builder
		for range rng.IntN(41) {
			r := ranges[rng.IntN(len(ranges))]
			b.WriteRune(r[0] + rune(rng.IntN(int(r[1]-r[0]+1))))
		}
		keys = append(keys, b.String())
	}
	return keys
}

// Acceptance: the shard Postgres computes with shard.Expr, the expression of
// the publication row filters, is shard.Of's for every key and count, and
// hashtext() itself is shard.Hashtext. Run on every version (14 included:
// the expression itself predates row filters).
func TestShardHashMatchesPostgres(t *testing.T) {
	d := newDB(t)
	ctx := context.Background()
	var enc string
	if err := d.pool.QueryRow(ctx, `SELECT current_setting('server_encoding')`).Scan(&enc); err != nil {
		t.Fatal(err)
	}
	if enc != "UTF8" {
		t.Fatalf("the test database's encoding is %s; shard.Of agrees with Postgres on non-ASCII keys only in UTF8", enc)
	}
	keys := shardKeys(t)
	rows, err := d.pool.Query(ctx, `SELECT hashtext(k) FROM unnest($1::text[]) WITH ORDINALITY AS u(k, ord) ORDER BY ord`, keys)
	if err != nil {
		t.Fatal(err)
	}
	hashes, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if want := shard.Hashtext([]byte(k)); hashes[i] != want {
			t.Errorf("hashtext(%.40q) (%d bytes) is %d in Postgres, %d in shard.Hashtext", k, len(k), hashes[i], want)
		}
	}
	for _, n := range []int{1, 2, 3, 4, 5, 8, 16, 100, shard.Max} {
		rows, err := d.pool.Query(ctx, `SELECT `+shard.Expr("k", n)+` FROM unnest($1::text[]) WITH ORDINALITY AS u(k, ord) ORDER BY ord`, keys)
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if len(got) != len(keys) {
			t.Fatalf("n=%d: %d results for %d keys", n, len(got), len(keys))
		}
		for i, k := range keys {
			if want := shard.Of([]byte(k), n); int(got[i]) != want {
				t.Errorf("n=%d: Postgres puts %.40q (%d bytes) in shard %d, shard.Of in %d", n, k, len(k), got[i], want)
			}
		}
	}
	t.Logf("%d keys, hashtext and the shard of 9 counts agree with Postgres %d", len(keys), serverMajor(t))
}

// probeShards runs outboxd's start-up checks of the shard hash for
// schema.table's key column on d and returns their error.
func probeShards(t *testing.T, d *db, schema, table, column string) error {
	t.Helper()
	ctx := context.Background()
	var k shard.KeyColumn
	if err := d.pool.QueryRow(ctx, shard.KeyColumnSQL, schema, table, column).Scan(k.Fields()...); err != nil {
		t.Fatalf("reading the key column: %v", err)
	}
	if err := shard.KeyColumnError(k, schema, table, column); err != nil {
		return err
	}
	var hashes []int32
	if err := d.pool.QueryRow(ctx, shard.ProbeCollatedSQL(k.Collation)).Scan(&hashes); err != nil {
		return shard.ProbeError(err)
	}
	return shard.VerifyProbe(hashes)
}

// The start-up probe passes for text and varchar key columns of the
// default and the "C" collation, and refuses other types, a missing
// column, and a nondeterministic collation (where the server has ICU).
func TestShardProbe(t *testing.T) {
	d := newDB(t)
	ctx := context.Background()
	if err := probeShards(t, d, "public", "outbox", "aggregate_id"); err != nil {
		t.Fatalf("the default outbox: %v", err)
	}
	if _, err := d.pool.Exec(ctx, shard.ProbeSQL); err != nil {
		t.Fatal(shard.ProbeError(err))
	}
	d.exec(t, `CREATE TABLE "Odd ""schema"" table" (c_key text COLLATE "C", vc varchar(40), u uuid, ch char(36))`)
	for _, tc := range []struct{ column, want string }{
		{"c_key", ""},
		{"vc", ""},
		{"u", `is uuid; the shard filters hash it with hashtext()`},
		{"ch", `is character(36)`},
		{"nosuch", `the key column "nosuch" is not a column of "public"."Odd ""schema"" table"`},
	} {
		err := probeShards(t, d, "public", `Odd "schema" table`, tc.column)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("key column %s: %v; want %q", tc.column, err, tc.want)
		}
	}
	if err := probeShards(t, d, "public", "no_table", "k"); err == nil || !strings.Contains(err.Error(), `the outbox table "public"."no_table" does not exist`) {
		t.Errorf("a missing table: %v", err)
	}
	if _, err := d.pool.Exec(ctx, `CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`); err != nil {
		t.Logf("no nondeterministic collation on this server (%v); that refusal is checked by the unit tests only", err)
		return
	}
	d.exec(t, `CREATE TABLE ci_outbox (k text COLLATE ci)`)
	if err := probeShards(t, d, "public", "ci_outbox", "k"); err == nil || !strings.Contains(err.Error(), `has the nondeterministic collation public.ci`) {
		t.Errorf("a nondeterministic collation: %v", err)
	}
	// What the refusal avoids: under it, hashtext() is not shard.Hashtext.
	var h int32
	if err := d.pool.QueryRow(ctx, `SELECT hashtext('Order-1' COLLATE ci)`).Scan(&h); err != nil {
		t.Fatal(err)
	}
	if h == shard.Hashtext([]byte("Order-1")) {
		t.Errorf("hashtext under a nondeterministic collation is the bytes' hash")
	}
}

// shardSet creates the publications and slots of n shards of d's outbox
// table, keyed by aggregate_id; cleanup drops the slots.
func shardSet(t *testing.T, d *db, n int) (slots, pubs []string) {
	t.Helper()
	ctx := context.Background()
	slots, err := shard.Names(d.slot, n)
	if err != nil {
		t.Fatal(err)
	}
	if pubs, err = shard.Names("outboxd", n); err != nil {
		t.Fatal(err)
	}
	if err := probeShards(t, d, "public", "outbox", "aggregate_id"); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := d.pool.Exec(ctx, shard.PublicationSQL(pubs[i], outboxTable("aggregate_id"), i, n)); err != nil {
			t.Fatal(shard.PublicationError(err, pubs[i], outboxTable("aggregate_id")))
		}
	}
	for _, s := range slots {
		d.exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, s)
		t.Cleanup(func() {
			if _, err := d.pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, s); err != nil {
				t.Logf("cleanup: dropping slot %s: %v", s, err)
			}
		})
	}
	return slots, pubs
}

// slotRow is an inserted outbox row as a slot delivers it, with the end LSN
// of its transaction.
type slotRow struct {
	id, key string
	end     wal.LSN
}

// peekShard reads, without consuming, what slot holds through publication
// pub: the inserted outbox rows, and the contents of the logical messages.
// It fails the test on an UPDATE or DELETE of the outbox table: shard
// publications publish inserts only.
func peekShard(t *testing.T, d *db, slot, pub string) (rows []slotRow, messages []string) {
	t.Helper()
	res, err := d.pool.Query(context.Background(), `SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', $2, 'messages', 'true')`, slot, pub)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	dec := wal.NewDecoder()
	open := 0 // rows of the transaction being read
	for res.Next() {
		var lsn string
		var data []byte
		if err := res.Scan(&lsn, &data); err != nil {
			t.Fatal(err)
		}
		item, err := dec.Decode(wal.LSN(parseLSN(t, lsn)), bytes.Clone(data))
		if err != nil {
			t.Fatal(err)
		}
		switch m := item.(type) {
		case *wal.Change:
			if m.Relation.Name != "outbox" {
				continue
			}
			if m.Op != wal.Insert {
				t.Errorf("slot %s (publication %s) delivered a change of kind %c of the outbox table; shard publications publish inserts only", slot, pub, m.Op)
				continue
			}
			rows = append(rows, slotRow{id: string(m.Tuple[m.Relation.Index("id")].Data), key: string(m.Tuple[m.Relation.Index("aggregate_id")].Data)})
			open++
		case *wal.Commit:
			for i := len(rows) - open; i < len(rows); i++ {
				rows[i].end = m.EndLSN
			}
			open = 0
		case *wal.Message:
			messages = append(messages, string(m.Content))
		}
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	return rows, messages
}

// Acceptance: with a publication and a slot per shard, every inserted row
// reaches exactly one slot, the one shard.Of names; a logical message, which
// no publication filters, reaches every slot, and shard.MessageOwner picks
// the one that delivers it.
func TestShardPublicationsRouteEachRowToOneSlot(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("%d shards", n), func(t *testing.T) {
			d := newDB(t)
			if refusedBefore(t, d, shard.MinVersion, shard.PublicationSQL("outboxd_0of2", outboxTable("aggregate_id"), 0, 2)) {
				return
			}
			slots, pubs := shardSet(t, d, n)
			ctx := context.Background()
			keys := shardKeys(t)[:400]
			want := map[string]string{} // id -> key
			for len(keys) > 0 {
				batch := keys[:min(50, len(keys))]
				keys = keys[len(batch):]
				rows, err := d.pool.Query(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
					SELECT 'shard', k, 'Happened', '{}' FROM unnest($1::text[]) k RETURNING id::text, aggregate_id`, batch)
				if err != nil {
					t.Fatal(err)
				}
				var id, key string
				if _, err := pgx.ForEachRow(rows, []any{&id, &key}, func() error { want[id] = key; return nil }); err != nil {
					t.Fatal(err)
				}
			}
			// The application's own updates and deletes, and an
			// insert-then-delete, in the same slots' range.
			d.exec(t, `UPDATE outbox SET payload = '{"updated": true}' WHERE aggregate_id LIKE 'order-%'`)
			d.exec(t, `DELETE FROM outbox WHERE aggregate_id = 'a'`)
			tx, err := d.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var id string
			if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type) VALUES ('shard', 'gone-at-commit', 'Happened') RETURNING id::text`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, id); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outbox', '{"aggregate_id": "msg-key"}')`); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			want[id] = "gone-at-commit"

			seen := map[string]int{} // id -> shard
			perShard := make([]int, n)
			owners := 0
			for i := range n {
				rows, messages := peekShard(t, d, slots[i], pubs[i])
				for _, r := range rows {
					key, ok := want[r.id]
					if !ok {
						t.Errorf("slot %s delivered a row %s that was not inserted", slots[i], r.id)
						continue
					}
					if r.key != key {
						t.Errorf("slot %s delivered row %s with key %q, inserted with %q", slots[i], r.id, r.key, key)
					}
					if j, dup := seen[r.id]; dup {
						t.Errorf("row %s (key %.40q) reached the slots of shards %d and %d", r.id, key, j, i)
					}
					seen[r.id] = i
					perShard[i]++
					if s := shard.Of([]byte(key), n); s != i {
						t.Errorf("row %s (key %.40q) reached shard %d; shard.Of says %d", r.id, key, i, s)
					}
				}
				if len(messages) != 1 || messages[0] != `{"aggregate_id": "msg-key"}` {
					t.Errorf("slot %s got the messages %q; every slot gets every message", slots[i], messages)
				}
				if shard.MessageOwner([]byte("msg-key"), true, n) == i {
					owners++
				}
			}
			for id, key := range want {
				if _, ok := seen[id]; !ok {
					t.Errorf("row %s (key %.40q) reached no slot", id, key)
				}
			}
			if owners != 1 {
				t.Errorf("%d shards deliver the message", owners)
			}
			t.Logf("%d rows over %d shards: %v", len(want), n, perShard)
		})
	}
}

// Acceptance 3: the application's UPDATE and DELETE of outbox rows keep
// working with the shard publications in place. A publication with the same
// row filter that also published UPDATE (or DELETE) would make Postgres
// refuse them, which is why shard publications publish inserts only.
func TestShardPublicationsKeepApplicationWritesWorking(t *testing.T) {
	d := newDB(t)
	if refusedBefore(t, d, shard.MinVersion, shard.PublicationSQL("outboxd_0of2", outboxTable("aggregate_id"), 0, 2)) {
		return
	}
	shardSet(t, d, 2)
	ctx := context.Background()
	write := func() error {
		for _, stmt := range []string{
			`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'shard', 'key-' || g, 'Happened', '{}' FROM generate_series(1, 20) g`,
			`UPDATE outbox SET payload = '{"v": 2}', aggregate_id = aggregate_id || '-moved' WHERE aggregate_id LIKE 'key-1%'`,
			`DELETE FROM outbox WHERE aggregate_id LIKE 'key-2%'`,
		} {
			if _, err := d.pool.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("%s: %w", stmt, err)
			}
		}
		return nil
	}
	if err := write(); err != nil {
		t.Fatalf("with insert-only shard publications: %v", err)
	}
	for _, publish := range []string{"update", "delete"} {
		stmt := strings.Replace(shard.PublicationSQL("filtered_"+publish, outboxTable("aggregate_id"), 0, 2),
			"publish = 'insert'", "publish = 'insert, "+publish+"'", 1)
		d.exec(t, stmt)
		err := write()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P10" || !strings.Contains(pgErr.Detail, "not part of the replica identity") {
			t.Errorf("a row-filtered publication publishing %ss: the application's writes gave %v; want Postgres to refuse the %s (42P10)", publish, err, strings.ToUpper(publish))
		} else {
			t.Logf("with a row-filtered publication publishing %ss, Postgres refuses the application's %s: %s (%s)", publish, strings.ToUpper(publish), pgErr.Message, pgErr.Detail)
		}
		d.exec(t, `DROP PUBLICATION filtered_`+publish)
	}
	if err := write(); err != nil {
		t.Fatalf("after dropping the other publications: %v", err)
	}
}

// Before Postgres 15 a publication has no row filter: the shard publication
// is a syntax error, which shard.PublicationError explains. From 15 on, the
// errors for a key column that is not text are explained too.
func TestShardPublicationErrors(t *testing.T) {
	d := newDB(t)
	ctx := context.Background()
	if err := probeShards(t, d, "public", "outbox", "aggregate_id"); err != nil {
		t.Fatal(err)
	}
	stmt := shard.PublicationSQL("outboxd_0of2", outboxTable("aggregate_id"), 0, 2)
	if refusedBefore(t, d, shard.MinVersion, stmt) {
		_, err := d.pool.Exec(ctx, stmt)
		if err := shard.PublicationError(err, "outboxd_0of2", outboxTable("aggregate_id")); err == nil || !strings.Contains(err.Error(), "came in Postgres 15: upgrade, or set postgres.shards: 1") {
			t.Errorf("Postgres %d's refusal explained as %v", serverMajor(t), err)
		}
		return
	}
	d.exec(t, stmt)
	d.exec(t, `ALTER TABLE outbox ADD COLUMN num integer, ADD COLUMN vc varchar(100)`)
	for _, tc := range []struct{ column, want string }{
		{"id", `the shard filter hashes public.outbox's key column "id" with hashtext(text), so the column must be text or varchar`},
		{"num", `so the column must be text or varchar`},
		{"nosuch", `the key column "nosuch" is not a column of public.outbox`},
	} {
		name := "bad_" + tc.column
		_, err := d.pool.Exec(ctx, shard.PublicationSQL(name, outboxTable(tc.column), 1, 3))
		if err := shard.PublicationError(err, name, outboxTable(tc.column)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("key column %s: %v; want %q", tc.column, err, tc.want)
		}
	}
	// A varchar key column is fine.
	d.exec(t, shard.PublicationSQL("vc_1of3", outboxTable("vc"), 1, 3))
}

// What resharding relies on, checked on Postgres itself while writers
// write: new slots created at consistent points C_j, the cutover X the
// highest of them and of the old slots' positions, the old shards
// delivering the transactions ending at or before X (shard.Window), and the
// new slots advanced to X delivering exactly those ending after it. Every
// row is then delivered once, by the shard of its key.
func TestShardCutoverSplitsTheStreamAtX(t *testing.T) {
	for _, r := range [][2]int{{1, 2}, {4, 2}} {
		t.Run(fmt.Sprintf("%d to %d", r[0], r[1]), func(t *testing.T) {
			d := newDB(t)
			if refusedBefore(t, d, shard.MinVersion, shard.PublicationSQL("outboxd_0of2", outboxTable("aggregate_id"), 0, 2)) {
				return
			}
			ctx := context.Background()
			oldSlots, oldPubs := shardSet(t, d, r[0])

			// Writers: transactions of 1 to 3 rows over 50 keys.
			type row struct{ id, key string }
			var (
				mu      sync.Mutex
				written []row
			)
			stop := make(chan struct{})
			errc := make(chan error, 1)
			go func() {
				errc <- func() error {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return nil
						default:
						}
						keys := make([]string, 1+i%3)
						for j := range keys {
							keys[j] = fmt.Sprintf("key-%d", rand.IntN(50))
						}
						rows, err := d.pool.Query(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type)
							SELECT 'shard', k, 'Happened' FROM unnest($1::text[]) k RETURNING id::text, aggregate_id`, keys)
						if err != nil {
							return err
						}
						var id, key string
						if _, err := pgx.ForEachRow(rows, []any{&id, &key}, func() error {
							mu.Lock()
							written = append(written, row{id, key})
							mu.Unlock()
							return nil
						}); err != nil {
							return err
						}
					}
				}()
			}()
			stopped := false
			stopWriters := func() {
				if !stopped {
					stopped = true
					close(stop)
					if err := <-errc; err != nil {
						t.Fatalf("writer: %v", err)
					}
				}
			}
			defer stopWriters()
			count := func() int { mu.Lock(); defer mu.Unlock(); return len(written) }
			waitRows := func(n int) {
				for count() < n {
					select {
					case err := <-errc:
						stopped = true
						t.Fatalf("writer stopped: %v", err)
					case <-time.After(10 * time.Millisecond):
					}
				}
			}

			waitRows(200)
			newSlots, newPubs := shardSet(t, d, r[1])
			var x wal.LSN
			for _, s := range append(append([]string{}, oldSlots...), newSlots...) {
				var lsn string
				if err := d.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, s).Scan(&lsn); err != nil {
					t.Fatal(err)
				}
				x = max(x, wal.LSN(parseLSN(t, lsn)))
			}
			waitRows(count() + 300)
			stopWriters()

			for _, s := range newSlots {
				d.exec(t, `SELECT pg_replication_slot_advance($1, $2::pg_lsn)`, s, x.String())
			}
			got := map[string]string{} // id -> who delivered it
			deliver := func(who string, r slotRow) {
				if prev, dup := got[r.id]; dup {
					t.Errorf("row %s (key %s, end %s) delivered by %s and %s; cutover %s", r.id, r.key, r.end, prev, who, x)
				}
				got[r.id] = who
			}
			w := shard.Window{Upto: x}
			oldN, newN := 0, 0
			for i, s := range oldSlots {
				rows, _ := peekShard(t, d, s, oldPubs[i])
				for _, r := range rows {
					if w.Delivers(r.end) {
						deliver(s, r)
						oldN++
					}
				}
			}
			for i, s := range newSlots {
				rows, _ := peekShard(t, d, s, newPubs[i])
				for _, row := range rows {
					if row.end <= x {
						t.Errorf("slot %s, advanced to %s, delivered row %s of a transaction ending at %s", s, x, row.id, row.end)
					}
					if sh := shard.Of([]byte(row.key), r[1]); sh != i {
						t.Errorf("row %s (key %s) reached new shard %d; shard.Of says %d", row.id, row.key, i, sh)
					}
					deliver(s, row)
					newN++
				}
			}
			for _, w := range written {
				if _, ok := got[w.id]; !ok {
					t.Errorf("row %s (key %s) was delivered by no shard; cutover %s", w.id, w.key, x)
				}
			}
			if len(got) != len(written) {
				t.Errorf("%d rows delivered, %d written", len(got), len(written))
			}
			if oldN == 0 || newN == 0 {
				t.Errorf("the cutover %s split %d rows into %d before and %d after; want both sides", x, len(written), oldN, newN)
			}
			t.Logf("%d rows written; cutover %s: %d delivered by the %d old shards, %d by the %d new ones", len(written), x, oldN, r[0], newN, r[1])
		})
	}
}

// outboxd status with postgres.shards: 2 lists each shard's slot with its
// lag, the worst first, and reports the worst shard's slot as the slot.
func TestShardStatus(t *testing.T) {
	d := newDB(t)
	if refusedBefore(t, d, shard.MinVersion, shard.PublicationSQL("outboxd_0of2", outboxTable("aggregate_id"), 0, 2)) {
		return
	}
	slots, _ := shardSet(t, d, 2)
	d.exec(t, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'shard', 'key-' || g, 'Happened', '{}' FROM generate_series(1, 2000) g`)
	// Shard 0 has confirmed everything; shard 1 nothing.
	d.exec(t, `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, slots[0])
	env := d.env("OUTBOXD_POSTGRES_SHARDS=2")
	text := runStatus(t, env)
	t.Logf("outboxd status:\n%s", text)
	mustContain(t, "outboxd status", text,
		`(?m)^slot +`+slots[1]+` \(pgoutput\), inactive`,
		`(?m)^shards +2 slots, the worst first`,
		`(?s)shard 1 +`+slots[1]+`: lag \d+(\.\d)? [KM]iB, confirmed [0-9A-F]+/[0-9A-F]+, inactive, wal_status reserved\n`+
			`shard 0 +`+slots[0]+`: lag \d+ B, confirmed`,
	)
	var rep struct {
		Slot     string `json:"slot"`
		LagBytes int64  `json:"lag_bytes"`
		Shards   []struct {
			Index       int    `json:"index"`
			Slot        string `json:"slot"`
			Publication string `json:"publication"`
			Exists      bool   `json:"exists"`
			LagBytes    int64  `json:"lag_bytes"`
		} `json:"shards"`
	}
	if err := json.Unmarshal([]byte(runStatus(t, env, "-json")), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Shards) != 2 || rep.Slot != slots[1] || rep.Shards[0].Slot != slots[1] || rep.Shards[0].Publication != "outboxd_1of2" ||
		!rep.Shards[0].Exists || rep.Shards[0].LagBytes <= rep.Shards[1].LagBytes || rep.LagBytes != rep.Shards[0].LagBytes {
		t.Errorf("status -json = %+v", rep)
	}
}
