package shard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
)

// hashtext() of these keys, from Postgres 17 (little-endian, UTF8, default
// collation); 14, 15, 16 and 18 print the same.
var goldenHashtext = []struct {
	key  string
	want int32
}{
	{"", -1477818771},
	{"a", 1075015857},
	{"b", -68821088},
	{"ab", 1718550461},
	{"abc", -785388649},
	{"abcd", -393934804},
	{"abcde", -445659580},
	{"abcdef", -1747460160},
	{"abcdefg", 501636814},
	{"abcdefgh", -1960928205},
	{"abcdefghi", -92131489},
	{"abcdefghij", 1948051852},
	{"abcdefghijk", -1483803693},
	{"abcdefghijkl", -1586087212},
	{"abcdefghijklm", 405849808},
	{"order-1", -1797687605},
	{"outboxd", 2007623632},
	{"0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", 1421089271},
	{"ключ", -884514432},
	{"日本語のキー", -1141945375},
	{"emoji 🎉🚀", -952305586},
	{strings.Repeat("x", 1000), -1157355676},
	{strings.Repeat("ж", 100000), -189590074},
}

func TestHashtext(t *testing.T) {
	for _, g := range goldenHashtext {
		if got := Hashtext([]byte(g.key)); got != g.want {
			t.Errorf("Hashtext(%.20q) = %d, Postgres says %d", g.key, got, g.want)
		}
	}
}

func TestOf(t *testing.T) {
	for _, g := range goldenHashtext {
		for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 100, Max} {
			// The unsigned value modulo n, as Expr computes it.
			if got, want := Of([]byte(g.key), n), int((int64(g.want)&0xffffffff)%int64(n)); got != want {
				t.Errorf("Of(%.20q, %d) = %d, want %d", g.key, n, got, want)
			}
		}
	}
	// Spread: 10,000 keys over 4 shards, each within 5% of a quarter.
	counts := make([]int, 4)
	for i := range 10000 {
		counts[Of(fmt.Appendf(nil, "order-%d", i), 4)]++
	}
	for i, c := range counts {
		if c < 2375 || c > 2625 {
			t.Errorf("shard %d of 4 got %d of 10000 keys", i, c)
		}
	}
}

func TestExpr(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want string
	}{
		{1, `0`},
		{2, `mod(hashtext("aggregate_id")::bigint & 4294967295, 2)`},
		{3, `mod(hashtext("aggregate_id")::bigint & 4294967295, 3)`},
		{256, `mod(hashtext("aggregate_id")::bigint & 4294967295, 256)`},
	} {
		if got := Expr("aggregate_id", tc.n); got != tc.want {
			t.Errorf("Expr(aggregate_id, %d) =\n%s\nwant\n%s", tc.n, got, tc.want)
		}
	}
	if got := Filter(`we"ird`, 1, 2); got != `mod(hashtext("we""ird")::bigint & 4294967295, 2) = 1` {
		t.Errorf("Filter quotes badly: %s", got)
	}
	// A NULL key has no hash: shard 0 takes it (issue 32 item 1).
	if got := Filter("k", 0, 4); got != `"k" IS NULL OR mod(hashtext("k")::bigint & 4294967295, 4) = 0` {
		t.Errorf("shard 0's filter: %s", got)
	}
}

// FilterCheckError tells a stale shard 0 filter (NULL keys go nowhere),
// which the caller fixes, from a wrong one, which it refuses.
func TestFilterCheckError(t *testing.T) {
	const alter = `BEGIN; ALTER PUBLICATION "p_0of2" DROP TABLE "public"."outbox"; ` +
		`ALTER PUBLICATION "p_0of2" ADD TABLE "public"."outbox" WHERE ("aggregate_id" IS NULL OR mod(hashtext("aggregate_id")::bigint & 4294967295, 2) = 0); COMMIT;`
	outbox := Table{"public", "outbox", "aggregate_id"}
	if got := RefilterSQL("p_0of2", []Table{outbox}, nil, 0, 2); got != alter {
		t.Errorf("RefilterSQL = %s", got)
	}
	check := func(c FilterCheck, err error) error {
		return FilterCheckError(c, err, "p_0of2", outbox, alter, 0, 2)
	}
	if err := check(FilterCheck{}, nil); err != nil {
		t.Errorf("a right filter: %v", err)
	}
	if err := check(FilterCheck{NullDiffers: true}, nil); !errors.Is(err, ErrStaleFilter) || !strings.Contains(err.Error(), alter) {
		t.Errorf("a stale filter: %v", err)
	}
	for _, c := range []struct {
		c   FilterCheck
		err error
	}{{FilterCheck{NullDiffers: true, KeysDiffer: 3, Example: "x"}, nil}, {FilterCheck{}, errors.New("column \"other\" does not exist")}} {
		if err := check(c.c, c.err); err == nil || errors.Is(err, ErrStaleFilter) || !strings.Contains(err.Error(), alter) {
			t.Errorf("%+v, %v: %v", c.c, c.err, err)
		}
	}
	if !strings.Contains(FilterCheckSQL(`(mod(hashtext(aggregate_id), 2) = 0)`, "aggregate_id", 0, 2), `coalesce(((mod(hashtext(aggregate_id), 2) = 0)), false) AS outboxd_a`) {
		t.Error("FilterCheckSQL does not evaluate the actual filter")
	}
}

func FuzzHashtext(f *testing.F) {
	for _, g := range goldenHashtext[:20] {
		f.Add([]byte(g.key))
	}
	f.Fuzz(func(t *testing.T, key []byte) {
		// The aligned path of hash_bytes reads whole words; on a
		// little-endian machine it must equal the byte-wise one.
		if got, want := hashBytes(key), wordwise(key); got != want {
			t.Errorf("%q: %d byte-wise, %d word-wise", key, got, want)
		}
		if n := len(key)%Max + 1; Of(key, n) >= n {
			t.Errorf("%q: shard %d of %d", key, Of(key, n), n)
		}
	})
}

// wordwise is hash_bytes' aligned path on a little-endian machine: the
// key's words as uint32s, and in the tail, a whole word where one is left.
func wordwise(k []byte) uint32 {
	a := 0x9e3779b9 + uint32(len(k)) + 3923095
	b, c := a, a
	word := func(i int) uint32 { return binary.LittleEndian.Uint32(k[i:]) }
	for len(k) >= 12 {
		a, b, c = mix(a+word(0), b+word(4), c+word(8))
		k = k[12:]
	}
	switch n := len(k); {
	case n >= 8:
		a += word(0)
		b += word(4)
		for i := 8; i < n; i++ {
			c += uint32(k[i]) << (8 * (i - 7))
		}
	case n >= 4:
		a += word(0)
		for i := 4; i < n; i++ {
			b += uint32(k[i]) << (8 * (i - 4))
		}
	default:
		for i := range n {
			a += uint32(k[i]) << (8 * i)
		}
	}
	return final(a, b, c)
}

func TestPanicsOnBadCounts(t *testing.T) {
	for _, f := range []func(){
		func() { Of(nil, 0) },
		func() { Of(nil, Max+1) },
		func() { Filter("k", 2, 2) },
		func() { Filter("k", -1, 2) },
		func() { _, _ = Name("s", 0, 0) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f()
		}()
	}
}

func TestPublicationSQL(t *testing.T) {
	got := PublicationSQL("outboxd_1of2", []Table{{"public", "outbox", "aggregate_id"}}, 1, 2)
	want := `CREATE PUBLICATION "outboxd_1of2" FOR TABLE "public"."outbox" WHERE (mod(hashtext("aggregate_id")::bigint & 4294967295, 2) = 1) WITH (publish = 'insert', publish_via_partition_root = true)`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	got = PublicationSQL("p", []Table{{"my schema", "Out", "k"}}, 0, 1)
	want = `CREATE PUBLICATION "p" FOR TABLE "my schema"."Out" WITH (publish = 'insert', publish_via_partition_root = true)`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// Several tables: each filtered on its own key column (issue 35 §1).
	several := []Table{{"a", "outbox", "aggregate_id"}, {"b", "events", "Key"}}
	got = PublicationSQL("outboxd_0of2", several, 0, 2)
	want = `CREATE PUBLICATION "outboxd_0of2" FOR TABLE "a"."outbox" WHERE ("aggregate_id" IS NULL OR mod(hashtext("aggregate_id")::bigint & 4294967295, 2) = 0), ` +
		`"b"."events" WHERE ("Key" IS NULL OR mod(hashtext("Key")::bigint & 4294967295, 2) = 0) WITH (publish = 'insert', publish_via_partition_root = true)`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// Only the tables named: the listed one dropped and added back, the
	// missing one added, in one transaction (review of issue 35 §1, S2).
	got = RefilterSQL("outboxd_1of2", several[:1], several[1:], 1, 2)
	want = `BEGIN; ALTER PUBLICATION "outboxd_1of2" DROP TABLE "a"."outbox"; ALTER PUBLICATION "outboxd_1of2" ADD TABLE "a"."outbox" WHERE (mod(hashtext("aggregate_id")::bigint & 4294967295, 2) = 1), ` +
		`"b"."events" WHERE (mod(hashtext("Key")::bigint & 4294967295, 2) = 1); COMMIT;`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// One transaction for every shard (review of issue 35 §1, S1).
	got = AddTablesSQL([]string{"outboxd_0of2", "outboxd_1of2"}, [][]Table{several[1:], several[1:]})
	want = `BEGIN; ALTER PUBLICATION "outboxd_0of2" ADD TABLE "b"."events" WHERE ("Key" IS NULL OR mod(hashtext("Key")::bigint & 4294967295, 2) = 0); ` +
		`ALTER PUBLICATION "outboxd_1of2" ADD TABLE "b"."events" WHERE (mod(hashtext("Key")::bigint & 4294967295, 2) = 1); COMMIT;`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got := AddTablesSQL([]string{"outboxd_0of2", "outboxd_1of2"}, [][]Table{nil, several[1:]}); got != AddTableSQL("outboxd_1of2", several[1], 1, 2) {
		t.Errorf("one publication lacking: %s", got)
	}
	if got := AddTablesSQL([]string{"outboxd_0of2", "outboxd_1of2"}, make([][]Table, 2)); got != "" {
		t.Errorf("none lacking: %q", got)
	}
	// The publications of both shard counts of a reshard (second review
	// of issue 35 §1, M1), a single shard's without a filter.
	got = AddLacksSQL([]Lack{{"outboxd_1of2", 1, 2, several[1:]}, {"outboxd", 0, 1, several[1:]}})
	want = `BEGIN; ALTER PUBLICATION "outboxd_1of2" ADD TABLE "b"."events" WHERE (mod(hashtext("Key")::bigint & 4294967295, 2) = 1); ` +
		`ALTER PUBLICATION "outboxd" ADD TABLE "b"."events"; COMMIT;`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	got = RefilterSQL("outboxd_1of2", nil, several[1:], 1, 2)
	want = AddTableSQL("outboxd_1of2", several[1], 1, 2)
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	got = AddTableSQL("outboxd_1of2", several[1], 1, 2)
	want = `ALTER PUBLICATION "outboxd_1of2" ADD TABLE "b"."events" WHERE (mod(hashtext("Key")::bigint & 4294967295, 2) = 1)`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

type pgErr struct{ code, msg string }

func (e *pgErr) Error() string    { return e.msg }
func (e *pgErr) SQLState() string { return e.code }

func TestPublicationError(t *testing.T) {
	if PublicationError(nil, "p", []Table{{"public", "outbox", "k"}}) != nil {
		t.Error("nil error explained")
	}
	for _, tc := range []struct {
		code, want string
	}{
		{"42601", "came in Postgres 15"},
		{"42883", "must be text or varchar"},
		{"0A000", "must be text or varchar"},
		{"42703", `the key column "k" is not a column of public.outbox`},
		{"XX000", `creating publication "p": exec: boom`},
	} {
		cause := &pgErr{tc.code, "boom"}
		err := PublicationError(fmt.Errorf("exec: %w", cause), "p", []Table{{"public", "outbox", "k"}})
		if !strings.Contains(err.Error(), tc.want) || !errors.Is(err, cause) {
			t.Errorf("%s: %v", tc.code, err)
		}
	}
	if ProbeError(nil) != nil {
		t.Error("nil probe error explained")
	}
	cause := errors.New("boom")
	if err := ProbeError(cause); !errors.Is(err, cause) || !strings.Contains(err.Error(), "hashtext() of the shard probe keys") {
		t.Error(err)
	}
}

func TestKeyColumnError(t *testing.T) {
	ok := KeyColumn{TableExists: true, Exists: true, Type: "text", Text: true, Collation: `pg_catalog."default"`, Deterministic: true}
	if err := KeyColumnError(ok, "public", "outbox", "aggregate_id"); err != nil {
		t.Error(err)
	}
	for _, tc := range []struct {
		edit func(*KeyColumn)
		want string
	}{
		{func(k *KeyColumn) { k.TableExists, k.Exists = false, false }, `the outbox table "public"."outbox" does not exist`},
		{func(k *KeyColumn) { k.Exists = false }, `the key column "aggregate_id" is not a column of "public"."outbox"; check router.key_column`},
		{func(k *KeyColumn) { k.Type, k.Text, k.Collation = "uuid", false, "" }, `is uuid; the shard filters hash it with hashtext(), which outboxd computes only for text and varchar`},
		{func(k *KeyColumn) { k.Type, k.Text = "character(36)", false }, `is character(36)`},
		{func(k *KeyColumn) { k.Collation, k.Deterministic = `public."ci"`, false }, `has the nondeterministic collation public."ci", under which hashtext() hashes a sort key outboxd cannot compute; give the column a deterministic collation (ALTER TABLE ... ALTER COLUMN "aggregate_id" TYPE text COLLATE "default"), or set postgres.shards: 1`},
	} {
		k := ok
		tc.edit(&k)
		if err := KeyColumnError(k, "public", "outbox", "aggregate_id"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v; want %q", k, err, tc.want)
		}
	}
}

func TestProbe(t *testing.T) {
	// probeArray is probeKeys, quoted.
	quoted := make([]string, len(probeKeys))
	for i, k := range probeKeys {
		quoted[i] = "'" + strings.ReplaceAll(k, "'", "''") + "'"
	}
	if want := "ARRAY[" + strings.Join(quoted, ", ") + "]"; probeArray != want {
		t.Errorf("probeArray =\n%s\nprobeKeys give\n%s", probeArray, want)
	}
	if !strings.Contains(ProbeSQL, `hashtext(k COLLATE pg_catalog."default")`) || ProbeCollatedSQL("") != ProbeSQL {
		t.Errorf("ProbeSQL = %s", ProbeSQL)
	}
	if got := ProbeCollatedSQL(`public."C"`); !strings.Contains(got, `hashtext(k COLLATE public."C")`) {
		t.Errorf("ProbeCollatedSQL = %s", got)
	}

	good := make([]int32, len(probeKeys))
	for i, k := range probeKeys {
		good[i] = Hashtext([]byte(k))
	}
	if err := VerifyProbe(good); err != nil {
		t.Error(err)
	}
	if err := VerifyProbe(good[1:]); err == nil {
		t.Error("a short probe verified")
	}
	// A big-endian server: every key's hash differs.
	bad := make([]int32, len(good))
	for i, h := range good {
		bad[i] = int32(bits.ReverseBytes32(uint32(h)))
	}
	if err := VerifyProbe(bad); err == nil || !strings.Contains(err.Error(), "for 19 of 19 probe keys") || !strings.Contains(err.Error(), "big-endian") || !strings.Contains(err.Error(), "set postgres.shards: 1") {
		t.Error(err)
	}
	// A LATIN1 database: only the non-ASCII keys' hashes differ.
	latin := append([]int32(nil), good...)
	for i, k := range probeKeys {
		if !isASCII(k) {
			latin[i]++
		}
	}
	if err := VerifyProbe(latin); err == nil || !strings.Contains(err.Error(), "all of them non-ASCII") || !strings.Contains(err.Error(), "the database encoding is not UTF8") {
		t.Error(err)
	}
}

func TestMessageOwner(t *testing.T) {
	if got := MessageOwner(nil, false, 4); got != 0 {
		t.Errorf("unkeyed message owned by %d", got)
	}
	for _, k := range []string{"a", "b", "order-1", ""} {
		if got, want := MessageOwner([]byte(k), true, 4), Of([]byte(k), 4); got != want {
			t.Errorf("message keyed %q owned by %d, its rows by %d", k, got, want)
		}
	}
}

func TestWindow(t *testing.T) {
	open := Window{}
	if !open.Delivers(1) || open.Past(1<<40) || open.Done(1<<40) || open.Confirm(77) != 77 {
		t.Error("the zero window is not open")
	}
	old := Window{Upto: 100}
	for end, want := range map[pglogrepl.LSN]bool{99: true, 100: true, 101: false} {
		if old.Delivers(end) != want || old.Past(end) == want {
			t.Errorf("Upto 100, end %d: delivers %v past %v", end, old.Delivers(end), old.Past(end))
		}
	}
	if old.Confirm(150) != 100 || old.Confirm(50) != 50 || !old.Done(100) || old.Done(99) {
		t.Error("Upto 100 confirms or finishes wrongly")
	}
	nu := Window{After: 100}
	if nu.Delivers(100) || !nu.Delivers(101) || nu.Past(1<<40) {
		t.Error("After 100 delivers wrongly")
	}
}
