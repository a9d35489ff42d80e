package admin

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
)

func TestConfirmedAge(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		st   relay.Status
		want *float64
	}{
		{"idle outbox: nothing in flight", relay.Status{ConfirmedCommitTime: now.Add(-3 * time.Hour)}, nil},
		{"in flight, nothing confirmed yet", relay.Status{InFlight: 5}, nil},
		{"in flight", relay.Status{InFlight: 5, ConfirmedCommitTime: now.Add(-1500 * time.Millisecond)}, ptr(1.5)},
		{"clock skew", relay.Status{InFlight: 1, ConfirmedCommitTime: now.Add(time.Second)}, ptr(0.0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := confirmedAge(tc.st, now)
			if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Errorf("confirmedAge = %v, want %v", deref(got), deref(tc.want))
			}
		})
	}
}

func TestLagText(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	idle := &relay.Status{State: relay.StateStreaming, ConfirmedCommitTime: now.Add(-3 * time.Hour)}
	busy := &relay.Status{State: relay.StateStreaming, InFlight: 12, ConfirmedCommitTime: now.Add(-2500 * time.Millisecond)}
	for _, tc := range []struct {
		name string
		rep  Report
		want string
	}{
		{"no process", Report{LagBytes: 2048}, "2.0 KiB of WAL since the confirmed position"},
		{"idle: no commit age although lag > 0", Report{LagBytes: 56, Process: idle, ConfirmedAge: confirmedAge(*idle, now)},
			"56 B of WAL since the confirmed position"},
		{"records in flight", Report{LagBytes: 3 << 20, Process: busy, ConfirmedAge: confirmedAge(*busy, now), FlushLag: "00:00:01.2"},
			"3.0 MiB of WAL since the confirmed position, 12 records in flight, last confirmed commit 2.5s ago, flush lag 00:00:01.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.rep.lagText(); got != tc.want {
				t.Errorf("lagText() =\n  %q, want\n  %q", got, tc.want)
			}
		})
	}
}

// TestWriteTextIdle: an idle outbox (lag bytes > 0 from WAL written by other
// tables, nothing in flight, the last confirmed commit hours ago) shows no
// commit age, and no wording that claims an undelivered event.
func TestWriteTextIdle(t *testing.T) {
	rep := Report{
		Slot: "outboxd", SlotExists: true, Plugin: "pgoutput", Active: true, ActivePID: 77,
		Confirmed: "0/16B3748", LagBytes: 56, Retained: 4096, WALStatus: "reserved",
		Publication: "outboxd", PubTables: []string{"public.outbox"}, Table: "public.outbox",
		Process: &relay.Status{State: relay.StateStreaming, ConfirmedCommitTime: time.Now().Add(-5 * time.Hour)},
	}
	rep.ConfirmedAge = confirmedAge(*rep.Process, time.Now())
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Log("\n" + out)
	for _, bad := range []string{"undelivered", "ago", "5h"} {
		if strings.Contains(out, bad) {
			t.Errorf("idle report contains %q", bad)
		}
	}
	if !strings.Contains(out, "4.0 KiB of WAL kept for the slot") {
		t.Error("the report does not show the retained WAL")
	}
}

func ptr(v float64) *float64 { return &v }

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

// A table Postgres never analysed has no row estimate (reltuples -1): the
// report says so rather than "~0 rows".
func TestWriteTextRowsNotKnown(t *testing.T) {
	rep := Report{Slot: "outboxd", SlotExists: true, Table: "public.outbox", TableRows: -1, TableBytes: 8192}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "rows not known (never analysed)") || strings.Contains(out, "~-1") {
		t.Errorf("report for a never-analysed table:\n%s", out)
	}
}

// TestWriteTextFailover: outboxd status prints each failover note on a
// row of its own.
func TestWriteTextFailover(t *testing.T) {
	rep := Report{Slot: "outboxd", SlotExists: true, Plugin: "pgoutput", WALStatus: "reserved",
		FailoverNotes: []string{"failover slot: standbys with sync_replication_slots = on keep a copy of it", "warning: standby s1 ..."}}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"\nfailover     failover slot: standbys", "\nfailover     warning: standby s1 ...\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}
