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

func TestCheckSlotInvalidated(t *testing.T) {
	info := SlotInfo{Name: "outboxd", Plugin: "pgoutput", Database: "app", WALStatus: "reserved", InvalidationReason: "rows_removed", ConfirmedFlushLSN: 0x16B3748}
	err := CheckSlot(info, "app")
	if err == nil || !strings.Contains(err.Error(), "invalidated (rows_removed)") || !strings.Contains(err.Error(), "0/16B3748") {
		t.Fatalf("CheckSlot = %v", err)
	}
	if !errors.Is(err, ErrSlotLost) {
		t.Errorf("%v is not ErrSlotLost", err)
	}
}
