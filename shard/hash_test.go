package shard

import (
	"crypto/md5"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestOf(t *testing.T) {
	// md5("a") = 0cc175b9..., and 0x0cc175b9 = 214005177, as Postgres
	// prints ('x' || substr(md5('a'), 1, 8))::bit(32)::bigint.
	for _, n := range []int{1, 2, 3, 4, 7, 8, 100, Max} {
		if got, want := Of([]byte("a"), n), 214005177%n; got != want {
			t.Errorf("Of(a, %d) = %d, want %d", n, got, want)
		}
	}
	// The high bit set: md5("b") = 92eb5ffe..., 0x92eb5ffe = 2464900094
	// (unsigned; a signed read would give a negative remainder).
	if got, want := Of([]byte("b"), 3), int(uint32(0x92eb5ffe)%3); got != want {
		t.Errorf("Of(b, 3) = %d, want %d", got, want)
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

// The remainder of the last k bytes equals the remainder of all four when n
// divides 256^k, which is what Expr relies on.
func TestBytesNeeded(t *testing.T) {
	for n := 1; n <= Max; n++ {
		k := bytesNeeded(n)
		for _, key := range []string{"", "a", "b", "ключ", "order-17"} {
			sum := md5.Sum([]byte(key))
			var v uint32
			for _, b := range sum[4-k : 4] {
				v = v<<8 | uint32(b)
			}
			if int(v%uint32(n)) != Of([]byte(key), n) {
				t.Fatalf("n=%d: the last %d bytes of %q give %d, Of gives %d", n, k, key, v%uint32(n), Of([]byte(key), n))
			}
		}
	}
	for n, want := range map[int]int{1: 1, 2: 1, 8: 1, 256: 1, 3: 4, 6: 4, 12: 4, 100: 4} {
		if got := bytesNeeded(n); got != want {
			t.Errorf("bytesNeeded(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestExpr(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want string
	}{
		{1, `0`},
		{2, `mod(get_byte(decode(md5("aggregate_id"), 'hex'), 3), 2)`},
		{4, `mod(get_byte(decode(md5("aggregate_id"), 'hex'), 3), 4)`},
		{3, `mod(get_byte(decode(md5("aggregate_id"), 'hex'), 0)::bigint * 16777216 + get_byte(decode(md5("aggregate_id"), 'hex'), 1) * 65536 + get_byte(decode(md5("aggregate_id"), 'hex'), 2) * 256 + get_byte(decode(md5("aggregate_id"), 'hex'), 3), 3)`},
	} {
		if got := Expr("aggregate_id", tc.n); got != tc.want {
			t.Errorf("Expr(aggregate_id, %d) =\n%s\nwant\n%s", tc.n, got, tc.want)
		}
	}
	if got := Filter(`we"ird`, 1, 2); got != `mod(get_byte(decode(md5("we""ird"), 'hex'), 3), 2) = 1` {
		t.Errorf("Filter quotes badly: %s", got)
	}
	// 250 = 2 * 125 needs all four bytes.
	if got := Expr("k", 250); !strings.Contains(got, "::bigint * 16777216") {
		t.Errorf("Expr(k, 250) = %s", got)
	}
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
	got := PublicationSQL("outboxd_1of2", "public", "outbox", "aggregate_id", 1, 2)
	want := `CREATE PUBLICATION "outboxd_1of2" FOR TABLE "public"."outbox" WHERE (mod(get_byte(decode(md5("aggregate_id"), 'hex'), 3), 2) = 1) WITH (publish = 'insert', publish_via_partition_root = true)`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	got = PublicationSQL("p", "my schema", "Out", "k", 0, 1)
	want = `CREATE PUBLICATION "p" FOR TABLE "my schema"."Out" WITH (publish = 'insert', publish_via_partition_root = true)`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

type pgErr struct{ code, msg string }

func (e *pgErr) Error() string    { return e.msg }
func (e *pgErr) SQLState() string { return e.code }

func TestPublicationError(t *testing.T) {
	if PublicationError(nil, "p", "public", "outbox", "k") != nil {
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
		err := PublicationError(fmt.Errorf("exec: %w", cause), "p", "public", "outbox", "k")
		if !strings.Contains(err.Error(), tc.want) || !errors.Is(err, cause) {
			t.Errorf("%s: %v", tc.code, err)
		}
	}
	if ProbeError(nil) != nil {
		t.Error("nil probe error explained")
	}
	if err := ProbeError(errors.New("could not compute MD5 hash")); !strings.Contains(err.Error(), "FIPS") {
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
	for end, want := range map[LSN]bool{99: true, 100: true, 101: false} {
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
