package replay

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// reads builds the SQL of a run's reads of the outbox table: keyset pages
// in the order of the key columns, within the operator's clause. It is
// pure, so the statements are tested without a server.
type reads struct {
	from  string   // the table, quoted
	cols  []string // the columns the router reads (the relation's), quoted
	keys  []string // the key columns (order, then the primary key's), quoted
	where string   // the operator's clause, checked by CheckWhere
}

func newReads(schema, name string, cols, keys []string, where string) reads {
	r := reads{from: pgx.Identifier{schema, name}.Sanitize(), where: where}
	for _, c := range cols {
		r.cols = append(r.cols, pgx.Identifier{c}.Sanitize())
	}
	for _, k := range keys {
		r.keys = append(r.keys, pgx.Identifier{k}.Sanitize())
	}
	return r
}

// filter is the FROM and WHERE that every read shares; the clause stands on
// lines of its own, so that a trailing -- comment in it ends there.
func (r reads) filter() string {
	return " FROM " + r.from + " WHERE (\n" + r.where + "\n)"
}

// bounds is the statement that reads, at the start of a run, how many rows
// match and how many of them have no value in the order column; at is
// where the clause starts in it, in characters from 1, as Postgres counts
// an error's position.
func (r reads) bounds() (sql string, at int) {
	head := "SELECT count(*), count(*) FILTER (WHERE " + r.keys[0] + " IS NULL)"
	sql = head + r.filter()
	return sql, len([]rune(head+" FROM "+r.from+" WHERE (\n")) + 1
}

// last is the statement that reads the key of the last matching row: the
// end of the run.
func (r reads) last() string {
	return "SELECT " + strings.Join(r.keys, ", ") + r.filter() + " ORDER BY " + r.order(" DESC") + " LIMIT 1"
}

// page is the statement that reads the next n rows after the key in
// parameters $1.. (from the first row when after is false), up to the
// run's end key in the parameters that follow: the router's columns, then
// the key columns.
func (r reads) page(after bool, n int) string {
	var b strings.Builder
	b.WriteString("SELECT " + strings.Join(r.cols, ", ") + ", " + strings.Join(r.keys, ", ") + r.filter())
	row := "(" + strings.Join(r.keys, ", ") + ")"
	next := 1
	if after {
		b.WriteString(" AND " + row + " > " + params(next, len(r.keys)))
		next += len(r.keys)
	}
	b.WriteString(" AND " + row + " <= " + params(next, len(r.keys)))
	fmt.Fprintf(&b, " ORDER BY %s LIMIT %d", r.order(""), n)
	return b.String()
}

func (r reads) order(dir string) string {
	parts := make([]string, len(r.keys))
	for i, k := range r.keys {
		parts[i] = k + dir
	}
	return strings.Join(parts, ", ")
}

// params returns "($from, ..., $from+n-1)".
func params(from, n int) string {
	p := make([]string, n)
	for i := range p {
		p[i] = fmt.Sprintf("$%d", from+i)
	}
	return "(" + strings.Join(p, ", ") + ")"
}
