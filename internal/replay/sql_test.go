package replay

import "testing"

func TestReads(t *testing.T) {
	r := newReads("app", "Out box", []string{"id", "payload"}, []string{"created_at", "id"}, "a = 1 -- note")
	for _, tc := range []struct{ name, got, want string }{
		{"bounds", first(r.bounds()), "SELECT count(*), count(*) FILTER (WHERE \"created_at\" IS NULL) FROM \"app\".\"Out box\" WHERE (\na = 1 -- note\n)"},
		{"last", r.last(), "SELECT \"created_at\", \"id\" FROM \"app\".\"Out box\" WHERE (\na = 1 -- note\n) ORDER BY \"created_at\" DESC, \"id\" DESC LIMIT 1"},
		{"first page", r.page(false, 500), "SELECT \"id\", \"payload\", \"created_at\", \"id\" FROM \"app\".\"Out box\" WHERE (\na = 1 -- note\n)" +
			" AND (\"created_at\", \"id\") <= ($1, $2) ORDER BY \"created_at\", \"id\" LIMIT 500"},
		{"next page", r.page(true, 10), "SELECT \"id\", \"payload\", \"created_at\", \"id\" FROM \"app\".\"Out box\" WHERE (\na = 1 -- note\n)" +
			" AND (\"created_at\", \"id\") > ($1, $2) AND (\"created_at\", \"id\") <= ($3, $4) ORDER BY \"created_at\", \"id\" LIMIT 10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", tc.got, tc.want)
			}
		})
	}
	// The clause's position, as Postgres counts an error's (from 1).
	sql, at := r.bounds()
	if got := []rune(sql)[at-1:][0]; got != 'a' {
		t.Fatalf("bounds: the clause starts at %d, where %q stands", at, got)
	}
}

func first(s string, _ int) string { return s }
