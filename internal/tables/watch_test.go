package tables

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/config"
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
		err := w.judge(0, tc.now, tc.startExists, tc.published)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v; want no finding", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrUnpublished) || !isUnpublished(err)):
			t.Errorf("%s: %v; want ErrUnpublished with %q", tc.name, err, tc.want)
		}
	}
}
