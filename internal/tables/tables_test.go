package tables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/wal"
)

// stub is a catalogue for find: relation ID → whether it exists and which
// outbox table it is a partition of (-1: none). It counts the look-ups.
type stub struct {
	rels map[uint32]struct {
		exists bool
		table  int
	}
	lookups int
}

func (s *stub) find(_ context.Context, id uint32) (bool, int, error) {
	s.lookups++
	r, ok := s.rels[id]
	if !ok {
		return false, -1, nil
	}
	return r.exists, r.table, nil
}

// newOutbox returns an Outbox of the named tables with relation IDs ids,
// its catalogue stubbed with cat, logging to the returned buffer.
func newOutbox(t *testing.T, names []string, ids []uint32, cat *stub) (*Outbox, *bytes.Buffer) {
	t.Helper()
	per := make([]config.Config, len(names))
	for i, n := range names {
		per[i].Postgres.Table = n
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	o := New(config.Postgres{Publication: "outboxd"}, per, ids, log, "", func(int, uint32, uint32) error { return nil }, nil)
	o.find = cat.find
	return o, &logs
}

func rel(id uint32, qualified string) *wal.Relation {
	schema, name, _ := strings.Cut(qualified, ".")
	return &wal.Relation{ID: id, Namespace: schema, Name: name}
}

// Which's decisions (review F9): by name, by the ID read at run start (a
// renamed table), as a partition (looked up once), and another table:
// ignored with one outbox table (a shared publication), a permanent
// ErrUnrouted with several, a dropped table alike.
func TestWhich(t *testing.T) {
	cat := &stub{rels: map[uint32]struct {
		exists bool
		table  int
	}{
		300: {true, -1},  // another table
		301: {true, 1},   // a partition of the second outbox table
		302: {false, -1}, // dropped since
	}}
	for _, tc := range []struct {
		name   string
		tables []string
		rel    *wal.Relation
		want   int // -1: ok false
		err    error
	}{
		{"by name", []string{"public.outbox"}, rel(100, "public.outbox"), 0, nil},
		{"renamed, by ID", []string{"public.outbox"}, rel(100, "public.outbox_old"), 0, nil},
		{"one table: another table ignored", []string{"public.outbox"}, rel(300, "public.other"), -1, nil},
		{"one table: a dropped table ignored", []string{"public.outbox"}, rel(302, "public.gone"), -1, nil},
		{"several: by name", []string{"public.outbox", "orders.events"}, rel(200, "orders.events"), 1, nil},
		{"several: by ID", []string{"public.outbox", "orders.events"}, rel(200, "orders.events_old"), 1, nil},
		{"several: a partition", []string{"public.outbox", "orders.events"}, rel(301, "orders.events_2026"), 1, nil},
		{"several: another table halts", []string{"public.outbox", "orders.events"}, rel(300, "public.other"), -1, ErrUnrouted},
		{"several: a dropped table halts", []string{"public.outbox", "orders.events"}, rel(302, "public.gone"), -1, ErrUnrouted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, _ := newOutbox(t, tc.tables, []uint32{100, 200}[:len(tc.tables)], cat)
			i, ok, err := o.Which(context.Background(), tc.rel)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if tc.err != nil {
				var p interface{ Permanent() bool }
				if !errors.As(err, &p) || !p.Permanent() || !strings.Contains(err.Error(), tc.rel.QualifiedName()) {
					t.Errorf("error %q is not permanent or does not name %s", err, tc.rel.QualifiedName())
				}
				return
			}
			if got := map[bool]int{true: i, false: -1}[ok]; got != tc.want {
				t.Errorf("Which = %d, %v; want %d", i, ok, tc.want)
			}
		})
	}
}

// A relation looked up once is not looked up again in the run.
func TestWhichLooksUpOnce(t *testing.T) {
	cat := &stub{rels: map[uint32]struct {
		exists bool
		table  int
	}{300: {true, -1}}}
	o, _ := newOutbox(t, []string{"public.outbox"}, []uint32{100}, cat)
	for range 3 {
		if _, ok, err := o.Which(context.Background(), rel(300, "public.other")); ok || err != nil {
			t.Fatalf("Which = %v, %v; want another table", ok, err)
		}
	}
	if cat.lookups != 1 {
		t.Errorf("%d look-ups, want 1", cat.lookups)
	}
}

// Review F7: a name match with a relation ID other than the one known, and
// one relation ID on two outbox tables, are logged at Warn.
func TestWhichWarnsOnNewID(t *testing.T) {
	cat := &stub{}
	o, logs := newOutbox(t, []string{"public.a", "public.b"}, []uint32{100, 200}, cat)
	ctx := context.Background()
	if i, ok, err := o.Which(ctx, rel(100, "public.a")); i != 0 || !ok || err != nil {
		t.Fatalf("Which(public.a) = %d, %v, %v", i, ok, err)
	}
	if logs.Len() != 0 {
		t.Fatalf("logged for an unchanged table: %s", logs)
	}
	// b dropped, a renamed to b: a's relation now has b's name.
	if i, ok, err := o.Which(ctx, rel(100, "public.b")); i != 1 || !ok || err != nil {
		t.Fatalf("Which(public.b, relation 100) = %d, %v, %v; want 1 (by name)", i, ok, err)
	}
	out := logs.String()
	for _, want := range []string{
		`level=WARN msg="outbox table public.b is another relation than when outboxd read it`,
		`relation=100 was=200`,
		`level=WARN msg="the relation of outbox table public.a now has the name of outbox table public.b (renamed)`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	logs.Reset()
	if _, _, err := o.Which(ctx, rel(100, "public.b")); err != nil || strings.Contains(logs.String(), "another relation") {
		t.Errorf("warned again for the same relation (err %v):\n%s", err, logs)
	}
}

// A table that a pattern entry matches and that none of the run's tables
// is, met while streaming, is adopted with that entry (its index is the
// next one), once; one that does not fit the entry halts with
// ErrUnfit, naming it; a dropped one halts as any dropped table.
func TestWhichPattern(t *testing.T) {
	cat := &stub{rels: map[uint32]struct {
		exists bool
		table  int
	}{20: {true, -1}, 21: {true, -1}, 22: {true, -1}, 24: {true, -1}}}
	per := []config.Config{{Postgres: config.Postgres{Table: "public.outbox"}}}
	var logs bytes.Buffer
	var adopted []string
	adopt := func(_ context.Context, _ *pgx.Conn, entry int, name string, _ uint32) error {
		switch name {
		case "tenant_bad.events":
			return errors.New("outbox table tenant_bad.events has no column k")
		case "tenant_renamed.events": // the relation is there, under another name
			return wal.Errorf(pg.ErrNoTable, "outbox table tenant_renamed.events does not exist")
		}
		adopted = append(adopted, fmt.Sprint(entry, " ", name))
		return nil
	}
	pgc := config.Postgres{Publication: "outboxd", Tables: []config.TableEntry{{Name: "public.outbox"}, {Name: "tenant_*.events"}}}
	o := New(pgc, per, []uint32{10}, slog.New(slog.NewTextHandler(&logs, nil)), "", func(int, uint32, uint32) error { return nil }, adopt)
	o.find = cat.find
	for _, step := range []struct {
		rel  *wal.Relation
		want int
		err  error
	}{
		{rel(10, "public.outbox"), 0, nil},
		{rel(20, "tenant_a.events"), 1, nil},
		{rel(20, "tenant_a.events"), 1, nil}, // by name now: no second adoption
		{rel(21, "tenant_bad.events"), -1, ErrUnfit},
		{rel(22, "other.events"), -1, ErrUnrouted},
		{rel(23, "tenant_gone.events"), -1, ErrUnrouted},    // dropped since
		{rel(24, "tenant_renamed.events"), -1, ErrUnrouted}, // renamed since
	} {
		i, ok, err := o.Which(context.Background(), step.rel)
		switch {
		case step.err != nil:
			if !errors.Is(err, step.err) {
				t.Errorf("%s: error %v, want %v", step.rel.QualifiedName(), err, step.err)
			}
		case err != nil || !ok || i != step.want:
			t.Errorf("%s: table %d, %v, %v; want %d", step.rel.QualifiedName(), i, ok, err, step.want)
		}
	}
	if strings.Join(adopted, ",") != "1 tenant_a.events" {
		t.Errorf("adopted %v, want tenant_a.events once with entry 1", adopted)
	}
	if _, _, err := o.Which(context.Background(), rel(21, "tenant_bad.events")); err == nil ||
		!strings.Contains(err.Error(), "tenant_bad.events (relation 21), created while outboxd ran, which postgres.tables[1] (tenant_*.events) matches, but it does not fit that entry: outbox table tenant_bad.events has no column k") {
		t.Errorf("unfit table: %v", err)
	}
	// A table of a pattern gone since its rows were written: the remedy
	// that loses nothing gives its name back (review-patterns35 M6).
	for _, r := range []*wal.Relation{rel(23, "tenant_gone.events"), rel(24, "tenant_renamed.events")} {
		_, _, err := o.Which(context.Background(), r)
		var werr *wal.Error
		if !errors.As(err, &werr) || !strings.Contains(werr.Msg, "which postgres.tables[1] (tenant_*.events) matches, but ") ||
			!strings.Contains(werr.Remedy, "give the name "+r.QualifiedName()+" back to a table of the same columns: rename the table back, or create it again") ||
			strings.Contains(werr.Remedy, "list "+r.QualifiedName()+" under postgres.tables") {
			t.Errorf("%s: %v; want the remedy that gives its name back", r.QualifiedName(), err)
		}
	}
}

// A logical message that names a table a pattern matches, before any row
// of it, adopts it; one that no entry matches is not this outboxd's.
func TestOwnerPattern(t *testing.T) {
	var adopted []string
	adopt := func(_ context.Context, _ *pgx.Conn, entry int, name string, _ uint32) error {
		if name == "tenant_nope.events" {
			return wal.Errorf(pg.ErrNoTable, "outbox table tenant_nope.events does not exist")
		}
		adopted = append(adopted, fmt.Sprint(entry, " ", name))
		return nil
	}
	pgc := config.Postgres{Publication: "outboxd", Tables: []config.TableEntry{{Name: "public.outbox"}, {Name: "tenant_*.events"}}}
	per := []config.Config{{Postgres: config.Postgres{Table: "public.outbox"}}}
	o := New(pgc, per, []uint32{10}, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)), "", func(int, uint32, uint32) error { return nil }, adopt)
	o.find = (&stub{}).find
	// A message naming a table of the pattern that is not there: a halt
	// that says so, not a table that does not fit (review-patterns35 M6).
	if _, _, err := o.Owner(context.Background(), "tenant_nope.events"); !errors.Is(err, ErrUnrouted) || errors.Is(err, ErrUnfit) ||
		!strings.Contains(err.Error(), "or the message's __outbox_table names a table that never was") {
		t.Errorf("a message naming a missing table of the pattern: %v", err)
	}
	for _, step := range []struct {
		owner string
		want  int
		ok    bool
	}{{"public.outbox", 0, true}, {"tenant_a.events", 1, true}, {"tenant_a.events", 1, true}, {"other.events", 0, false}} {
		i, ok, err := o.Owner(context.Background(), step.owner)
		if err != nil || ok != step.ok || (ok && i != step.want) {
			t.Errorf("%s: %d, %v, %v; want %d, %v", step.owner, i, ok, err, step.want, step.ok)
		}
	}
	if i, ok, err := o.Which(context.Background(), rel(20, "tenant_a.events")); err != nil || !ok || i != 1 {
		t.Errorf("a row of the adopted table: %d, %v, %v", i, ok, err)
	}
	if strings.Join(adopted, ",") != "1 tenant_a.events" {
		t.Errorf("adopted %v, want tenant_a.events once with entry 1", adopted)
	}
}

// A table two patterns match is adopted with the first, as start-up
// (pg.MatchTables) takes it (review-patterns35 M2).
func TestWhichOverlappingPatterns(t *testing.T) {
	cat := &stub{rels: map[uint32]struct {
		exists bool
		table  int
	}{20: {true, -1}, 21: {true, -1}}}
	var adopted []string
	adopt := func(_ context.Context, _ *pgx.Conn, entry int, name string, _ uint32) error {
		adopted = append(adopted, fmt.Sprint(entry, " ", name))
		return nil
	}
	pgc := config.Postgres{Publication: "outboxd", Tables: []config.TableEntry{{Name: "public.outbox"}, {Name: "tenant_*.events"}, {Name: "*.events"}}}
	per := []config.Config{{Postgres: config.Postgres{Table: "public.outbox"}}}
	o := New(pgc, per, []uint32{10}, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)), "", func(int, uint32, uint32) error { return nil }, adopt)
	o.find = cat.find
	for _, r := range []*wal.Relation{rel(20, "tenant_z.events"), rel(21, "shop.events")} {
		if _, ok, err := o.Which(context.Background(), r); err != nil || !ok {
			t.Fatalf("%s: %v, %v", r.QualifiedName(), ok, err)
		}
	}
	if got := strings.Join(adopted, ","); got != "1 tenant_z.events,2 shop.events" {
		t.Errorf("adopted %s, want tenant_z.events with entry 1 and shop.events with entry 2", got)
	}
}

// A new table outboxd's role may not read halts with the GRANT for remedy,
// not as a table that does not fit its entry (review-patterns35 M5).
func TestWhichUnreadable(t *testing.T) {
	cat := &stub{rels: map[uint32]struct {
		exists bool
		table  int
	}{20: {true, -1}}}
	adopt := func(context.Context, *pgx.Conn, int, string, uint32) error {
		return wal.Errorf(pg.ErrNoPrivilege, "role lp lacks USAGE on schema tenant_p; run GRANT USAGE ON SCHEMA tenant_p TO lp")
	}
	pgc := config.Postgres{Publication: "outboxd", Tables: []config.TableEntry{{Name: "public.outbox"}, {Name: "tenant_*.events"}}}
	per := []config.Config{{Postgres: config.Postgres{Table: "public.outbox"}}}
	o := New(pgc, per, []uint32{10}, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)), "", func(int, uint32, uint32) error { return nil }, adopt)
	o.find = cat.find
	_, _, err := o.Which(context.Background(), rel(20, "tenant_p.events"))
	var werr *wal.Error
	if !errors.As(err, &werr) || !errors.Is(err, ErrUnreadable) || errors.Is(err, ErrUnfit) {
		t.Fatalf("a table the role may not read: %v; want ErrUnreadable", err)
	}
	if !strings.Contains(werr.Msg, "outboxd's role may not read it: role lp lacks USAGE on schema tenant_p; run GRANT USAGE ON SCHEMA tenant_p TO lp") ||
		!strings.Contains(werr.Remedy, "ALTER DEFAULT PRIVILEGES GRANT USAGE ON SCHEMAS TO") || !strings.Contains(werr.Remedy, "ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO") {
		t.Errorf("message %q, remedy %q; want the GRANT and the default privileges", werr.Msg, werr.Remedy)
	}
}
