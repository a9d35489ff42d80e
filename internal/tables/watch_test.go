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
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrUnpublished) || !isUnpublished(err)):
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
	names, _, _ := w.list()
	w.Add("tenant_a", "outbox", 200)
	w.Add("public", "outbox", 300)
	w.Add("tenant_a", "outbox", 400)
	if got := w.String(); got != "public.outbox,tenant_a.outbox" {
		t.Fatalf("tables checked: %s; want public.outbox,tenant_a.outbox", got)
	}
	if len(names) != 1 {
		t.Errorf("a list read before Add changed: %v", names)
	}
	quoted, shown, ids := w.list()
	if quoted[1] != `"tenant_a"."outbox"` || ids[0] != 100 || ids[1] != 200 {
		t.Errorf("after Add: %v %v %v; want the first relation IDs 100 and 200", quoted, shown, ids)
	}
	err := w.judge(quoted[1], shown[1], ids[1], 201, false, false)
	if e, ok := err.(*wal.Error); !ok || !strings.Contains(e.Msg, "outbox table tenant_a.outbox is not published") ||
		!strings.Contains(e.Remedy, `ADD TABLE "tenant_a"."outbox"`) {
		t.Errorf("an added table replaced: %v; want it named with its ADD TABLE", err)
	}
}
