package preflight

import (
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/pg"
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

// TestStandbyDropsConfirmedBound: a process that sees the slot held by
// another, or past what it confirmed, no longer judges a synchronised copy
// by its own old position (issue 32 item 8): the active instance confirmed
// past it, and the copy is lawfully further.
func TestStandbyDropsConfirmedBound(t *testing.T) {
	for _, tc := range []struct {
		name string
		info wal.SlotInfo
		want wal.LSN
	}{
		{"its own, released", wal.SlotInfo{ConfirmedFlushLSN: 0x3000000}, 0x3000000},
		{"behind its own", wal.SlotInfo{ConfirmedFlushLSN: 0x2000000}, 0x3000000},
		{"held by another", wal.SlotInfo{Active: true, ConfirmedFlushLSN: 0x3000000}, 0},
		{"advanced by another", wal.SlotInfo{ConfirmedFlushLSN: 0x3000100}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &History{confirmed: 0x3000000}
			h.sawSlot(tc.info)
			if h.confirmed != tc.want {
				t.Errorf("bound %s, want %s", h.confirmed, tc.want)
			}
			// After the promotion the copy is past the old bound: used
			// when the bound was dropped, refused when it is this
			// process's own.
			copyAhead := wal.SlotInfo{Synced: true, Failover: true, ConfirmedFlushLSN: 0x5000000}
			why := replacedWhy(1, 2, copyAhead, h.confirmed)
			if (why == "") != (tc.want == 0) {
				t.Errorf("replacedWhy with bound %s = %q", h.confirmed, why)
			}
		})
	}
}

// TestSplitBrainRefusal: a server on an older timeline than one outboxd saw
// is refused, and the message says what it is (the old primary) and what
// to do (fence it or take it out of the DSN), not that a standby was
// promoted or that a slot should be created (issue 32 item 9).
func TestSplitBrainRefusal(t *testing.T) {
	h := &History{newest: 2, newestAt: "10.0.0.2:5432"}
	if err := h.refuseOlderTimeline("10.0.0.1:5432", "", 2); err != nil {
		t.Errorf("same timeline refused: %v", err)
	}
	if err := h.refuseOlderTimeline("10.0.0.1:5432", "", 3); err != nil {
		t.Errorf("later timeline refused: %v", err)
	}
	for _, err := range []error{
		&SplitBrainError{Server: "10.0.0.1:5432", Timeline: 1, Newer: "10.0.0.2:5432", Seen: 2},
		refuseNewerPrimary("10.0.0.1:5432", "", 1, []pg.Primary{{Addr: "10.0.0.1:5432", Timeline: 1}, {Addr: "10.0.0.2:5432", Timeline: 2, Standby: true}}),
	} {
		if err == nil {
			t.Fatal("no refusal")
		}
		msg := err.Error()
		for _, want := range []string{"split brain", "timeline 1", "timeline 2", "10.0.0.2:5432", "old primary", "Fence it", "take it out of postgres.dsn"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%q lacks %q", msg, want)
			}
		}
		for _, wrong := range []string{"promoted to", "create the slot", "pg_create_logical_replication_slot"} {
			if strings.Contains(msg, wrong) {
				t.Errorf("%q says %q", msg, wrong)
			}
		}
	}
	if err := refuseNewerPrimary("10.0.0.1:5432", "", 2, []pg.Primary{{Addr: "10.0.0.1:5432", Timeline: 1}, {Addr: "10.0.0.3:5432", Timeline: 2, Standby: true}}); err != nil {
		t.Errorf("no newer primary, refused: %v", err)
	}
	if err := refuseNewerPrimary("10.0.0.1:5432", "", 1, []pg.Primary{{Addr: "10.0.0.3:5432", Timeline: 2, Standby: true}}); err == nil ||
		!strings.Contains(err.Error(), "postgres.standby_dsns") {
		t.Errorf("a standby_dsns host that is a primary on a later timeline: %v, want split brain naming standby_dsns", err)
	}
}

// TestSplitBrainSameCluster: timelines are compared only within one
// database cluster (system identifier): after a pg_upgrade (a new cluster
// on timeline 1, Postgres 17 keeping the slot) or beside a standby_dsns
// host of another cluster on a later timeline, nothing is split brain. An
// unknown identifier ("") is taken for the same cluster (review of issue
// 32 item 9, finding 4).
func TestSplitBrainSameCluster(t *testing.T) {
	const a, b = "7300000000000000001", "7400000000000000002"
	for _, c := range []struct {
		name           string
		seenSys        string
		seen           int
		system         string
		tli            int
		others         []pg.Primary
		refused, newer bool // by refuseOlderTimeline, by refuseNewerPrimary
	}{
		{"same cluster, older timeline", a, 3, a, 1, nil, true, false},
		{"unknown identifier, older timeline", a, 3, "", 1, nil, true, false},
		{"upgraded cluster on timeline 1", a, 3, b, 1, nil, false, false},
		{"newer primary of the same cluster", "", 0, a, 1, []pg.Primary{{Addr: "10.0.0.2:5432", Timeline: 2, System: a}}, false, true},
		{"newer primary, identifier unknown", "", 0, a, 1, []pg.Primary{{Addr: "10.0.0.2:5432", Timeline: 2}}, false, true},
		{"standby_dsns host of another cluster", "", 0, a, 1, []pg.Primary{{Addr: "10.0.0.3:5432", Timeline: 5, System: b, Standby: true}}, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &History{newest: c.seen, newestAt: "10.0.0.2:5432", newestSystem: c.seenSys}
			if err := h.refuseOlderTimeline("10.0.0.1:5432", c.system, c.tli); (err != nil) != c.refused {
				t.Errorf("refuseOlderTimeline: %v, want refused %v", err, c.refused)
			}
			if err := refuseNewerPrimary("10.0.0.1:5432", c.system, c.tli, c.others); (err != nil) != c.newer {
				t.Errorf("refuseNewerPrimary: %v, want refused %v", err, c.newer)
			}
		})
	}
	// Once the upgraded cluster is seen, its timelines are the ones that
	// count: the old cluster's timeline 3 no longer refuses its timeline 1,
	// and the old cluster back on timeline 3 is another cluster again.
	h := &History{newest: 3, newestAt: "10.0.0.2:5432", newestSystem: a}
	h.sawTimeline("10.0.0.1:5432", b, 1)
	if h.newest != 1 || h.newestSystem != b {
		t.Errorf("after the upgraded cluster: newest %d of %q, want 1 of %q", h.newest, h.newestSystem, b)
	}
	if err := h.refuseOlderTimeline("10.0.0.1:5432", b, 1); err != nil {
		t.Errorf("the upgraded cluster refused: %v", err)
	}
}
