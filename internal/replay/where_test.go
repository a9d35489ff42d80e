package replay

import (
	"strings"
	"testing"
)

func TestCheckWhere(t *testing.T) {
	for _, tc := range []struct {
		name, clause string
		err          string // a part of the error; "" for none
	}{
		{"condition", `created_at >= '2026-01-01'`, ""},
		{"true", `true`, ""},
		{"nested parentheses", `(a = 1 OR (b = 2)) AND c IN (1, 2)`, ""},
		{"parenthesis in a string", `payload->>'x' = ')'`, ""},
		{"semicolon in a string", `event_type = 'a;b'`, ""},
		{"doubled quote", `event_type = 'it''s ) ;'`, ""},
		{"E string escape", `event_type = E'it\'s )'`, ""},
		{"quoted identifier", `"we;ird)" = 1`, ""},
		{"dollar quote", `payload::text = $x$ ); $x$`, ""},
		{"empty dollar quote", `payload::text = $$)$$`, ""},
		{"line comment at the end", `a = 1 -- ) ;`, ""},
		{"line comment then more", "a = 1 -- );\nAND b = 2", ""},
		{"block comment", `a = 1 /* ) /* ; */ ( */ AND b = 2`, ""},
		{"parameter", `a = $1`, "holds a parameter ($1...) at character 5"},
		{"dollar in an identifier", `a$1 = 1`, ""},
		{"empty", ``, "-where is empty"},
		{"blank", " \t\n", "-where is empty"},
		{"second statement", `true; DROP TABLE outbox`, "holds a ';' at character 5"},
		{"closes the wrapper", `a = 1) OR (true`, "closes a parenthesis at character 6"},
		{"left open", `(a = 1`, "leaves 1 parenthesis(es) open"},
		{"unterminated string", `a = 'x`, "string starting at character 5 unterminated"},
		{"string ended by escape", `a = E'x\'`, "string starting at character 6 unterminated"},
		{"unterminated identifier", `"a = 1`, "quoted identifier starting at character 1"},
		{"unterminated dollar quote", `a = $q$ x`, "dollar-quoted string starting at character 5"},
		{"unterminated comment", `a = 1 /* x`, "comment starting at character 7"},
		{"unterminated nested comment", `a = 1 /* /* x */`, "comment starting at character 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckWhere(tc.clause)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("CheckWhere(%q) = %v, want nil", tc.clause, err)
			case tc.err != "" && err == nil:
				t.Fatalf("CheckWhere(%q) = nil, want an error with %q", tc.clause, tc.err)
			case tc.err != "" && !strings.Contains(err.Error(), tc.err):
				t.Fatalf("CheckWhere(%q) = %v, want an error with %q", tc.clause, err, tc.err)
			}
		})
	}
}

func FuzzCheckWhere(f *testing.F) {
	for _, s := range []string{`a = 'x'`, `$q$ ) $q$`, `/* /* */ */`, `E'\''`, `"a""b"`, "-- x\n)"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_ = CheckWhere(s) // never panics
	})
}
