package relay

import (
	"strings"
	"testing"

	"github.com/outboxd/outboxd/wal"
)

func TestCheckFailoverVersion(t *testing.T) {
	for _, tc := range []struct {
		major    int
		version  string
		failover bool
		err      string
	}{
		{14, "14.18", true, "postgres.failover_slot is true, but Postgres 14.18 has no failover slots (they came in 17); set postgres.failover_slot: false, or upgrade Postgres"},
		{16, "16.9 (Debian 16.9-1)", true, "Postgres 16.9 (Debian 16.9-1) has no failover slots"},
		{16, "16.9", false, ""},
		{17, "17.5", true, ""},
		{18, "18.0", true, ""},
	} {
		err := checkFailoverVersion(tc.major, tc.version, tc.failover)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s, failover %v: %v, want %q", tc.version, tc.failover, err, tc.err)
		}
	}
}

// TestReplacedWhy: after a timeline change a running outboxd resumes only
// from a synchronised copy no further than it confirmed.
func TestReplacedWhy(t *testing.T) {
	synced := wal.SlotInfo{Synced: true, Failover: true, ConfirmedFlushLSN: 0x3000060}
	fresh := wal.SlotInfo{ConfirmedFlushLSN: 0x5000000}
	for _, tc := range []struct {
		name       string
		saved, tli int
		info       wal.SlotInfo
		confirmed  wal.LSN
		want       string
	}{
		{"same timeline", 1, 1, fresh, 0x3000000, ""},
		{"first start", 0, 2, fresh, 0, ""},
		{"synced copy behind", 1, 2, synced, 0x3000100, ""},
		{"synced copy at", 1, 2, synced, 0x3000060, ""},
		{"synced copy, position unknown", 1, 2, synced, 0, ""},
		{"created after the promotion", 1, 2, fresh, 0x3000000, "not a synchronised copy of the one outboxd used: it was created after the promotion, at 0/5000000"},
		{"synced copy ahead", 1, 2, synced, 0x3000000, "at 0/3000060, past the last position outboxd confirmed (0/3000000)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := replacedWhy(tc.saved, tc.tli, tc.info, tc.confirmed)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("replacedWhy = %q, want %q", got, tc.want)
			}
		})
	}
}
