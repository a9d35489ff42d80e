package wal

import (
	"errors"
	"strings"
	"testing"
)

func TestParseTimelineHistory(t *testing.T) {
	for _, tc := range []struct {
		name, content, want, err string
	}{
		{"one promotion", "1\t0/14FC6F0\tno recovery target specified\n", "0/14FC6F0", ""},
		{"the last of several", "1\t0/3000000\tno recovery target specified\n\n2\t1/A0000028\tbefore 2026-11-24 12:00:00+00\n", "1/A0000028", ""},
		{"comments", "# written by hand\n1\t0/5000000\treason\n", "0/5000000", ""},
		{"empty", "", "", "no switch point"},
		{"no LSN", "1\n", "", "no switch point"},
		{"bad LSN", "1\tnope\treason\n", "", "parsing LSN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseTimelineHistory([]byte(tc.content))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got.String() != tc.want {
				t.Errorf("= %s, %v; want %s", got, err, tc.want)
			}
		})
	}
}

// timelineEnd finds where a given timeline ended in a later timeline's
// history.
func TestTimelineEnd(t *testing.T) {
	history := "1\t0/3000000\tno recovery target specified\n\n2\t1/A0000028\tbefore 2026-11-24 12:00:00+00\n"
	for _, tc := range []struct {
		old  int
		want string
		ok   bool
	}{{1, "0/3000000", true}, {2, "1/A0000028", true}, {3, "0/0", false}, {11, "0/0", false}} {
		got, ok, err := timelineEnd([]byte(history), tc.old)
		if err != nil || ok != tc.ok || got.String() != tc.want {
			t.Errorf("timelineEnd(history, %d) = %s, %v, %v; want %s, %v", tc.old, got, ok, err, tc.want, tc.ok)
		}
	}
	if _, _, err := timelineEnd([]byte("1\tnope\treason\n"), 1); err == nil {
		t.Error("a bad LSN: no error")
	}
}

func TestSlotSQL(t *testing.T) {
	if got := CreateSlotSQL("outboxd", true); got != "SELECT pg_create_logical_replication_slot('outboxd', 'pgoutput', false, false, true)" {
		t.Errorf("failover: %s", got)
	}
	if got := CreateSlotSQL("outboxd", false); got != "SELECT pg_create_logical_replication_slot('outboxd', 'pgoutput')" {
		t.Errorf("no failover: %s", got)
	}
	if got := AlterSlotFailoverSQL("outboxd"); got != `ALTER_REPLICATION_SLOT "outboxd" ( FAILOVER true )` {
		t.Errorf("alter: %s", got)
	}
}

// TestCheckSlotInvalidated: every invalidated slot has wal_status lost
// (18.6 with idle_replication_slot_timeout: lost | idle_timeout), so the
// cause is read from invalidation_reason first; the remedy depends on the
// timeline.
func TestCheckSlotInvalidated(t *testing.T) {
	for _, tc := range []struct {
		name     string
		info     SlotInfo
		tli      int
		want     []string
		unwanted string
	}{
		{"idle timeout, 18", SlotInfo{WALStatus: "lost", InvalidationReason: "idle_timeout"}, 1,
			[]string{"invalidated (idle_timeout): Postgres can no longer decode it", "after its confirmed position 0/16B3748", "start outboxd again with postgres.create_slot: true"}, "max_slot_wal_keep_size"},
		{"rows removed, 17", SlotInfo{WALStatus: "lost", InvalidationReason: "rows_removed"}, 2,
			[]string{"invalidated (rows_removed)", "create a new one with SELECT pg_create_logical_replication_slot('outboxd', 'pgoutput') (outboxd creates it only on a server on timeline 1)"}, "max_slot_wal_keep_size"},
		{"wal removed, 17", SlotInfo{WALStatus: "lost", InvalidationReason: "wal_removed"}, 1,
			[]string{"Postgres removed WAL it still needed (max_slot_wal_keep_size)", "start outboxd again"}, "let outboxd"},
		{"lost, 16", SlotInfo{WALStatus: "lost"}, 0,
			[]string{"Postgres removed WAL it still needed (max_slot_wal_keep_size)", "create a new one with SELECT"}, "let outboxd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info := tc.info
			info.Name, info.Plugin, info.Database, info.ConfirmedFlushLSN = "outboxd", "pgoutput", "app", 0x16B3748
			err := CheckSlot(info, "app", RecreateRemedy(tc.tli, "outboxd", false))
			if !errors.Is(err, ErrSlotLost) {
				t.Fatalf("CheckSlot = %v, want ErrSlotLost", err)
			}
			var hinted interface{ Hint() string }
			if !errors.As(err, &hinted) || hinted.Hint() == "" {
				t.Fatalf("CheckSlot = %v, without a hint", err)
			}
			text := err.Error() + "\n" + hinted.Hint()
			if strings.Contains(err.Error(), "drop the slot") {
				t.Errorf("%q has the remedy, which is the hint's", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("%q lacks %q", text, w)
				}
			}
			if strings.Contains(text, tc.unwanted) {
				t.Errorf("%q has %q", text, tc.unwanted)
			}
		})
	}
}
