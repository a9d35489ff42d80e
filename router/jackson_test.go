package router

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// goldenLines reads the tab-separated lines of a golden file that
// testdata/java/Golden.java wrote with Kafka Connect's Jackson and Java's
// BigDecimal.
func goldenLines(t *testing.T, name string) [][]string {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "#") {
			continue
		}
		out = append(out, strings.Split(sc.Text(), "\t"))
	}
	if err := sc.Err(); err != nil || len(out) == 0 {
		t.Fatalf("reading %s: %v (%d lines)", name, err, len(out))
	}
	return out
}

func TestJacksonStringGolden(t *testing.T) {
	for _, l := range goldenLines(t, "jackson_strings.golden") {
		in, _ := hex.DecodeString(l[0])
		want, _ := hex.DecodeString(l[1])
		if got := appendJacksonString(nil, in); string(got) != string(want) {
			t.Errorf("%q: got %s, Jackson wrote %s", in, got, want)
		}
	}
}

// TestJacksonEveryCodePoint compares the escaping of every code point with
// what Jackson wrote for it.
func TestJacksonEveryCodePoint(t *testing.T) {
	for _, l := range goldenLines(t, "jackson_planes.golden") {
		plane, _ := strconv.Atoi(l[0])
		h := sha256.New()
		for start := rune(plane << 16); start < rune(plane+1)<<16; start += 256 {
			var s []byte
			for cp := start; cp < start+256; cp++ {
				if cp < 0xD800 || cp > 0xDFFF {
					s = utf8.AppendRune(s, cp)
				}
			}
			h.Write(appendJacksonString(nil, s))
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != l[1] {
			t.Errorf("plane %d: escaping differs from Jackson's (hash %s, want %s)", plane, got, l[1])
		}
	}
}

func TestBigDecimalGolden(t *testing.T) {
	for _, l := range goldenLines(t, "bigdecimal.golden") {
		got, ok := appendBigDecimal(nil, []byte(l[0]))
		if !ok || string(got) != l[1] {
			t.Errorf("%s: got %s (%v), BigDecimal.toString is %s", l[0], got, ok, l[1])
		}
	}
	for _, bad := range []string{"NaN", "Infinity", "-Infinity", "", "-", ".", "1.", ".5", "1e5", "1.2.3"} {
		if got, ok := appendBigDecimal(nil, []byte(bad)); ok {
			t.Errorf("%q: got %s, want a refusal", bad, got)
		}
	}
}

func TestEpochDay(t *testing.T) {
	for in, want := range map[string]string{"1970-01-01": "0", "2024-02-29": "19782", "1969-12-31": "-1", "0001-01-01": "-719162"} {
		if got, ok := appendEpochDay(nil, []byte(in)); !ok || string(got) != want {
			t.Errorf("%s: got %s (%v), want %s", in, got, ok, want)
		}
	}
	for _, bad := range []string{"infinity", "-infinity", "0044-03-15 BC"} {
		if got, ok := appendEpochDay(nil, []byte(bad)); ok {
			t.Errorf("%q: got %s, want a refusal", bad, got)
		}
	}
}
