package tables

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/config"
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
	o := New(config.Postgres{Publication: "outboxd"}, per, ids, log, "", func(int, uint32, uint32) error { return nil })
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
