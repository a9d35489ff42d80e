package backfill

import (
	"strings"
	"testing"
)

func TestKeyTable(t *testing.T) {
	for _, tt := range []struct{ slot, want string }{
		{"outboxd", "outboxd_backfill_outboxd"},
		{strings.Repeat("s", 46), "outboxd_backfill_" + strings.Repeat("s", 46)},
	} {
		if got := keyTable(tt.slot); got != tt.want {
			t.Errorf("keyTable(%q) = %q, want %q", tt.slot, got, tt.want)
		}
	}
	long, longer := keyTable(strings.Repeat("s", 63)), keyTable(strings.Repeat("s", 62)+"t")
	if len(long) != 63 || len(longer) != 63 || long == longer {
		t.Errorf("keyTable of two 63-character slots: %q and %q; want two distinct names of 63 bytes", long, longer)
	}
}
