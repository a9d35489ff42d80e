package router

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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

// TestKeyDefault follows PostgresDefaultValueConverter on the expressions
// pg_get_expr prints for the usual defaults.
func TestKeyDefault(t *testing.T) {
	for _, tc := range []struct {
		expr   string
		oid    uint32
		domain bool
		want   string // "" for no default; "error" for a refusal
	}{
		{"gen_random_uuid()", oidUUID, false, `"00000000-0000-0000-0000-000000000000"`},
		{"uuid_generate_v4()", oidUUID, false, `"00000000-0000-0000-0000-000000000000"`},
		{"'76019D1A-AD2E-4B22-96E9-1A6D6543C818'::uuid", oidUUID, false, `"76019d1a-ad2e-4b22-96e9-1a6d6543c818"`},
		{"'1-2-3-4-5'::uuid", oidUUID, false, "error"},
		{"NULL::uuid", oidUUID, false, ""},
		{"nextval('outbox_id_seq'::regclass)", oidInt8, false, "0"},
		{"42", oidInt4, false, "42"},
		{"'-7'::integer", oidInt4, false, "-7"},
		{"'99999'::integer", oidInt2, false, ""}, // Short.parseShort fails: no default
		{"(1 + 2)", oidInt4, false, ""},
		{"NULL::bigint", oidInt8, false, ""},
		{"true", oidBool, false, "true"},
		{"'o''brien'::text", oidText, false, `"o'brien"`},
		{"'abc'::character varying", oidVarchar, false, `"abc"`},
		{"(md5((random())::text))", oidText, false, `""`},
		{"CURRENT_USER", oidText, false, `"CURRENT_USER"`},
		{"'{}'::jsonb", oidJSONB, false, `"{}"`},
		{"gen_random_uuid()", oidUUID, true, "error"},
		{"", oidUUID, true, ""},
	} {
		got, err := keyDefault(tc.expr, tc.oid, tc.domain)
		switch {
		case tc.want == "error" && err == nil:
			t.Errorf("%s: got %s, want a refusal", tc.expr, got)
		case tc.want != "error" && (err != nil || string(got) != tc.want):
			t.Errorf("%s (OID %d): got %s (%v), want %s", tc.expr, tc.oid, got, err, tc.want)
		}
	}
}

// TestExpandGolden compares expand_json_payload with what Debezium's own
// classes sent (testdata/java/Expand.java): expanded, declined (the payload
// as a JSON string), or a failed task (a poison row for outboxd).
func TestExpandGolden(t *testing.T) {
	for _, l := range goldenLines(t, "expand.golden") {
		in, _ := hex.DecodeString(l[0])
		got, err := appendExpanded(nil, in)
		if l[1] == "DIES" {
			if !errors.Is(err, errDebeziumDies) {
				t.Errorf("%s: got %s (%v), Debezium's task dies", in, got, err)
			}
			continue
		}
		want, _ := hex.DecodeString(l[1])
		if err != nil || string(got) != string(want) {
			t.Errorf("%s: got %s (%v), Debezium sent %s", in, got, err, want)
		}
	}
}

func TestJavaDouble(t *testing.T) {
	for f, want := range map[float64]string{
		1.1: "1.1", 1.5e-7: "1.5E-7", 100: "100.0", 1e7: "1.0E7", 9999999: "9999999.0", 0.001: "0.001", 0.0001: "1.0E-4",
		-2.5: "-2.5", 4.9e-324: "4.9E-324", 1.7976931348623157e308: "1.7976931348623157E308", 123456789: "1.23456789E8", 2e-3: "0.002",
	} {
		if got := string(appendJavaDouble(nil, f)); got != want {
			t.Errorf("%v: got %s, want %s", f, got, want)
		}
	}
}

// FuzzExpand: any payload expands, is declined as a JSON string, or is
// refused where Debezium dies; what is written is always valid JSON.
func FuzzExpand(f *testing.F) {
	for _, l := range goldenLines(&testing.T{}, "expand.golden") {
		in, _ := hex.DecodeString(l[0])
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		out, err := appendExpanded(nil, p)
		if err != nil {
			if !errors.Is(err, errDebeziumDies) && !errors.Is(err, errTooLarge) {
				t.Fatalf("%q: %v", p, err)
			}
			return
		}
		if !json.Valid(out) && utf8.Valid(p) {
			t.Fatalf("%q expanded to invalid JSON %q", p, out)
		}
	})
}

// TestExpandBounds: a payload nested deeper than Jackson reads (1,000
// levels) is sent as a string, as Debezium sends it, and one nested
// millions deep neither overflows the stack (a crash no poison policy can
// catch, repeated at every restart) nor is expanded; an array of objects of
// thousands of shapes, which Debezium writes each with the fields of all,
// is a poison row instead of gigabytes (review of issue 33).
func TestExpandBounds(t *testing.T) {
	nested := func(n int) []byte {
		return []byte(strings.Repeat("[", n) + "1" + strings.Repeat("]", n))
	}
	for _, c := range []struct {
		name     string
		in       []byte
		expanded bool
	}{
		{"1000 levels with the object", nested(999), true},
		{"1001 levels with the object", nested(1000), false},
		{"5,000,000 levels", nested(5_000_000), false},
		{"5,000,000 unclosed", []byte(strings.Repeat("[", 5_000_000)), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := appendExpanded(nil, []byte("{\"a\":"+string(c.in)+"}"))
			if err != nil {
				t.Fatal(err)
			}
			if str := len(out) > 0 && out[0] == '"'; str == c.expanded {
				t.Errorf("expanded %v, want %v (%.40s...)", !str, c.expanded, out)
			}
		})
	}
	var b strings.Builder
	b.WriteString(`{"a":[`)
	for i := range 10_000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"k%d":1}`, i)
	}
	b.WriteString(`]}`)
	if _, err := appendExpanded(nil, []byte(b.String())); !errors.Is(err, errTooLarge) {
		t.Errorf("10,000 object shapes: %v, want a poison row (errTooLarge)", err)
	}
}
