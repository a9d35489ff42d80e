package shard

import (
	"strings"
	"testing"
)

func TestName(t *testing.T) {
	for _, tc := range []struct {
		base string
		i, n int
		want string
	}{
		{"outboxd", 0, 1, "outboxd"},
		{"outboxd", 0, 2, "outboxd_0of2"},
		{"outboxd", 3, 4, "outboxd_3of4"},
		{"outboxd", 255, 256, "outboxd_255of256"},
	} {
		got, err := Name(tc.base, tc.i, tc.n)
		if err != nil || got != tc.want {
			t.Errorf("Name(%q, %d, %d) = %q, %v; want %q", tc.base, tc.i, tc.n, got, err, tc.want)
		}
		i, n, ok := Parse(tc.base, got)
		if !ok || i != tc.i || n != tc.n {
			t.Errorf("Parse(%q, %q) = %d, %d, %v", tc.base, got, i, n, ok)
		}
	}
	// 63 bytes is the limit: a 57-byte base takes _0of2 (5 bytes) and a
	// 58-byte one still does; a 59-byte one does not.
	b58 := strings.Repeat("s", 58)
	if got, err := Name(b58, 1, 2); err != nil || len(got) != 63 {
		t.Errorf("Name(58 bytes, 1, 2) = %q, %v", got, err)
	}
	_, err := Name(b58+"s", 1, 2)
	if err == nil || !strings.Contains(err.Error(), "shorten") || !strings.Contains(err.Error(), "at most 58 bytes") {
		t.Errorf("Name(59 bytes, 1, 2): %v", err)
	}
	if _, err := Names(strings.Repeat("s", 57), 16); err == nil || !strings.Contains(err.Error(), "_10of16") {
		t.Errorf("Names(57 bytes, 16) wants the first too-long name (_10of16): %v", err)
	}
	if _, err := Name("outboxd_1of2", 0, 2); err == nil {
		t.Error("a base that looks like a shard name was accepted")
	}
}

func TestParse(t *testing.T) {
	for _, name := range []string{
		"outboxd_", "outboxd_0of1", "outboxd_2of2", "outboxd_01of2", "outboxd_0of02",
		"outboxd_0of257", "outboxd_xof2", "outboxd_0ofx", "outboxd_0of2x", "other_0of2",
		"outboxd_0of2_1of2", "outboxd0of2", "outboxd_-1of2", "outboxd_1000of2000",
	} {
		if i, n, ok := Parse("outboxd", name); ok {
			t.Errorf("Parse(outboxd, %q) = %d, %d, true", name, i, n)
		}
	}
	if i, n, ok := Parse("a_b", "a_b_1of3"); !ok || i != 1 || n != 3 {
		t.Errorf("a base with an underscore: %d %d %v", i, n, ok)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"outboxd", "outboxd_0of2", "outboxd_10of16", "x_1of"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		i, n, ok := Parse("outboxd", name)
		if !ok {
			return
		}
		if n < 1 || n > Max || i < 0 || i >= n {
			t.Fatalf("Parse(%q) = %d of %d", name, i, n)
		}
		if again, err := Name("outboxd", i, n); err != nil || again != name {
			t.Fatalf("Parse(%q) = %d of %d, which Name makes %q (%v)", name, i, n, again, err)
		}
	})
}
