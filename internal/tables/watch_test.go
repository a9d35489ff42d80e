package tables

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/wal"
)

// judge's decisions: what the catalogue says about a table, by its name
// now and by its relation at the run's start, against the publication.
func TestWatchJudge(t *testing.T) {
	c := config.Default()
	c.Postgres.Table = "public.outbox"
	w := NewWatch(c.Postgres, []config.Config{c}, []uint32{100}, "", slog.Default())
	for _, tc := range []struct {
		name        string
		now         uint32
		startExists bool
		published   bool
		want        string // "" for no finding
	}{
		{"published as it was", 100, true, true, ""},
		{"renamed: the name is free, the relation flows", 0, true, false, ""},
		{"swapped in by rename: another relation by the name", 200, true, false, "is not published by publication"},
		{"dropped and created again", 200, false, false, "is not published by publication"},
		{"removed from the publication", 100, true, false, "is not published by publication"},
		{"dropped", 0, false, false, "was dropped while outboxd ran"},
		{"created again and added to the publication", 200, false, true, ""},
	} {
		err := w.judge(w.names[0], w.shown[0], w.ids[0], tc.now, tc.startExists, tc.published)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v; want no finding", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrUnpublished) || !isFinding(err)):
			t.Errorf("%s: %v; want ErrUnpublished with %q", tc.name, err, tc.want)
		}
	}
}

// Add: a table learnt while the run streams joins the check once; one the
// Watch checks already is left with its first relation ID.
func TestWatchAdd(t *testing.T) {
	c := config.Default()
	c.Postgres.Table = "public.outbox"
	w := NewWatch(c.Postgres, []config.Config{c}, []uint32{100}, "", slog.Default())
	names, _, _, _ := w.list()
	w.Add("tenant_a", "outbox", 200)
	w.Add("public", "outbox", 300)
	w.Add("tenant_a", "outbox", 400)
	if got := w.String(); got != "public.outbox,tenant_a.outbox" {
		t.Fatalf("tables checked: %s; want public.outbox,tenant_a.outbox", got)
	}
	if len(names) != 1 {
		t.Errorf("a list read before Add changed: %v", names)
	}
	quoted, shown, ids, _ := w.list()
	if quoted[1] != `"tenant_a"."outbox"` || ids[0] != 100 || ids[1] != 200 {
		t.Errorf("after Add: %v %v %v; want the first relation IDs 100 and 200", quoted, shown, ids)
	}
	err := w.judge(quoted[1], shown[1], ids[1], 201, false, false)
	if e, ok := err.(*wal.Error); !ok || !strings.Contains(e.Msg, "outbox table tenant_a.outbox is not published") ||
		!strings.Contains(e.Remedy, `ADD TABLE "tenant_a"."outbox"`) {
		t.Errorf("an added table replaced: %v; want it named with its ADD TABLE", err)
	}
}

// A table of a pattern (matched at start-up, or added while streaming)
// that is dropped leaves the check once two checks in a row found it so,
// and the run goes on; replaced by a relation the publication lacks, it
// ends the run; a table listed by its exact name ends the run when dropped
// (review-patterns35 M6).
func TestWatchDroppedPatternTable(t *testing.T) {
	c := config.Default()
	c.Postgres.Tables = []config.TableEntry{{Name: "public.outbox"}, {Name: "tenant_*.events"}}
	a, b := c, c
	a.Postgres.Table, b.Postgres.Table = "public.outbox", "tenant_a.events"
	w := NewWatch(c.Postgres, []config.Config{a, b}, []uint32{100, 200}, "", slog.Default())
	w.Add("tenant_b", "events", 300)
	w.Add("tenant_c", "events", 400)
	fine := func(i int, id uint32) watchRead {
		return watchRead{pubExists: true, i: i, now: id, startExists: true, published: true}
	}
	dropped := func(i int) watchRead { return watchRead{pubExists: true, i: i} }
	for _, step := range []struct {
		reads     []watchRead
		want      string // a finding's text, "" for none
		remaining string
	}{
		{[]watchRead{fine(1, 100), fine(2, 200), dropped(3), fine(4, 400)}, "", "public.outbox,tenant_a.events,tenant_b.events,tenant_c.events"},
		{[]watchRead{fine(1, 100), fine(2, 200), dropped(3), fine(4, 400)}, "", "public.outbox,tenant_a.events,tenant_c.events"},
		{[]watchRead{fine(1, 100), dropped(2), fine(3, 400)}, "", "public.outbox,tenant_a.events,tenant_c.events"},
		{[]watchRead{fine(1, 100), fine(2, 201), fine(3, 400)}, "", "public.outbox,tenant_a.events,tenant_c.events"}, // created again (and published): not twice in a row
		{[]watchRead{fine(1, 100), dropped(2), fine(3, 400)}, "", "public.outbox,tenant_a.events,tenant_c.events"},
		{[]watchRead{fine(1, 100), dropped(2), fine(3, 400)}, "", "public.outbox,tenant_c.events"},
		{[]watchRead{fine(1, 100), {pubExists: true, i: 2, now: 401, startExists: false, published: false}}, "outbox table tenant_c.events is not published", "public.outbox,tenant_c.events"},
		{[]watchRead{dropped(1), fine(2, 400)}, "outbox table public.outbox was dropped while outboxd ran", "public.outbox,tenant_c.events"},
	} {
		names, shown, ids, pattern := w.list()
		err := w.decide(step.reads, names, shown, ids, pattern)
		switch {
		case step.want == "" && err != nil:
			t.Errorf("%v: %v; want no finding", step.reads, err)
		case step.want != "" && (err == nil || !strings.Contains(err.Error(), step.want) || !isFinding(err)):
			t.Errorf("%v: %v; want ErrUnpublished with %q", step.reads, err, step.want)
		}
		if got := w.String(); got != step.remaining {
			t.Errorf("%v: checking %s; want %s", step.reads, got, step.remaining)
		}
	}
}
