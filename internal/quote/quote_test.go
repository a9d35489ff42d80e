package quote

import "testing"

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, ident, literal string }{
		{"outbox", `"outbox"`, `'outbox'`},
		{`a"b`, `"a""b"`, `'a"b'`},
		{"it's", `"it's"`, `'it''s'`},
		{`back\slash`, `"back\slash"`, `'back\slash'`},
		{"", `""`, `''`},
	} {
		if got := Ident(tc.in); got != tc.ident {
			t.Errorf("Ident(%q) = %s, want %s", tc.in, got, tc.ident)
		}
		if got := Literal(tc.in); got != tc.literal {
			t.Errorf("Literal(%q) = %s, want %s", tc.in, got, tc.literal)
		}
	}
}
