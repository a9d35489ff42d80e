package admin

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/status"
)

func TestConfirmedAge(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		st   status.Status
		want *float64
	}{
		{"idle outbox: nothing in flight", status.Status{ConfirmedCommitTime: now.Add(-3 * time.Hour)}, nil},
		{"in flight, nothing confirmed yet", status.Status{InFlight: 5}, nil},
		{"in flight", status.Status{InFlight: 5, ConfirmedCommitTime: now.Add(-1500 * time.Millisecond)}, ptr(1.5)},
		{"clock skew", status.Status{InFlight: 1, ConfirmedCommitTime: now.Add(time.Second)}, ptr(0.0)},
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
	idle := &status.Status{State: status.Streaming, ConfirmedCommitTime: now.Add(-3 * time.Hour)}
	busy := &status.Status{State: status.Streaming, InFlight: 12, ConfirmedCommitTime: now.Add(-2500 * time.Millisecond)}
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
		Process: &status.Status{State: status.Streaming, ConfirmedCommitTime: time.Now().Add(-5 * time.Hour)},
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

// With shards the report lists every shard's slot, the worst first: a
// missing slot, then the greatest lag, then the lowest index.
func TestSortShards(t *testing.T) {
	s := []ShardSlot{
		{Index: 0, Exists: true, LagBytes: 10},
		{Index: 1, Exists: true, LagBytes: 5000},
		{Index: 2, Exists: false},
		{Index: 3, Exists: true, LagBytes: 10},
		{Index: 4, Exists: true, LagBytes: 7000},
	}
	sortShards(s)
	var got []int
	for _, sh := range s {
		got = append(got, sh.Index)
	}
	if want := []int{2, 4, 1, 0, 3}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

func TestWriteTextShards(t *testing.T) {
	shards := []ShardSlot{
		{Index: 1, Slot: "outboxd_1of3", Publication: "outboxd_1of3", Exists: true, Active: true, ActivePID: 41, Confirmed: "0/3000000", LagBytes: 5 << 20, WALStatus: "reserved", FlushLag: "00:00:02"},
		{Index: 0, Slot: "outboxd_0of3", Publication: "outboxd_0of3", Exists: true, Active: true, ActivePID: 40, Confirmed: "0/3500000", LagBytes: 2048, WALStatus: "reserved"},
		{Index: 2, Slot: "outboxd_2of3", Publication: "outboxd_2of3", Exists: true, Confirmed: "0/3400000", LagBytes: 1024, WALStatus: "extended"},
	}
	rep := Report{Slot: "outboxd_1of3", SlotExists: true, Plugin: "pgoutput", Active: true, ActivePID: 41, Confirmed: "0/3000000",
		LagBytes: 5 << 20, WALStatus: "reserved", Publication: "outboxd_1of3", PubTables: []string{"public.outbox"}, Table: "public.outbox", Shards: shards}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Log("\n" + out)
	want := []string{
		"slot         outboxd_1of3 (pgoutput), active, held by pid 41\n",
		"lag          5.0 MiB of WAL since the confirmed position\n",
		"shards       3 slots, the worst first (the slot above is the first)\n",
		"shard 1      outboxd_1of3: lag 5.0 MiB, confirmed 0/3000000, active (pid 41), wal_status reserved, flush lag 00:00:02\n",
		"shard 0      outboxd_0of3: lag 2.0 KiB, confirmed 0/3500000, active (pid 40), wal_status reserved\n",
		"shard 2      outboxd_2of3: lag 1.0 KiB, confirmed 0/3400000, inactive, wal_status extended\n",
	}
	last := -1
	for _, w := range want {
		i := strings.Index(out, w)
		if i < 0 {
			t.Errorf("report lacks %q", w)
			continue
		}
		if i < last {
			t.Errorf("%q is out of order", w)
		}
		last = i
	}
	missing := ShardSlot{Index: 3, Slot: "outboxd_3of4"}
	if got := missing.text(); got != "outboxd_3of4 does not exist" {
		t.Errorf("a missing shard slot: %q", got)
	}
	// One shard: no shard lines.
	rep.Shards = nil
	b.Reset()
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "shard") {
		t.Errorf("an unsharded report mentions shards:\n%s", b.String())
	}
}

// With several outbox tables the report lists each on a line of its own,
// with its size estimate (issue 35 §1, "outboxd status lists the tables").
func TestWriteTextEachTable(t *testing.T) {
	rep := Report{Slot: "outboxd", SlotExists: true, Table: "public.outbox,orders.events,wallet.gone", TableRows: -1, TableBytes: 3 * 8192,
		Tables: []TableSize{
			{Name: "public.outbox", Exists: true, Rows: 12, Bytes: 16384},
			{Name: "orders.events", Exists: true, Rows: -1, Bytes: 8192},
			{Name: "wallet.gone"},
		}}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"\noutbox       public.outbox: ~12 rows, 16.0 KiB\n",
		"\noutbox       orders.events: rows not known (never analysed), 8.0 KiB\n",
		"\noutbox       wallet.gone: does not exist\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "public.outbox,orders.events") {
		t.Errorf("report shows the comma list:\n%s", out)
	}
}
