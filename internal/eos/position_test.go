package eos

import (
	"testing"
	"time"
)

func TestPositionRoundTrip(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, p := range []Position{
		{LSN: 0x16B3748, Slot: "outboxd"},
		{LSN: 0x1_0000_0010, Txn: 0x1_0000_2000, Rows: 1234, Slot: "outboxd_1of4", System: "7441234567890123456"},
		{LSN: 0x20, Timeline: 3, Slot: "outboxd"},
		{Slot: "outboxd", System: "7441234567890123456", Backfill: `{"lsn":"0/1500","after":["x","7"],"sent":3,"done":false}`},
		{},
	} {
		got, err := DecodePosition(p.Encode(at))
		if err != nil || got != p {
			t.Errorf("decode(encode(%+v)) = %+v, %v", p, got, err)
		}
	}
	for _, bad := range []string{`not json`, `{"lsn": "xyz"}`, `{"lsn": "0/10", "txn": "?"}`} {
		if _, err := DecodePosition([]byte(bad)); err == nil {
			t.Errorf("DecodePosition(%s) accepted it", bad)
		}
	}
	if p, _ := DecodePosition([]byte(`{"lsn":"0/20","slot":"s","at":"x"}`)); p != (Position{LSN: 0x20, Slot: "s"}) {
		t.Errorf("a position without a system identifier decoded as %+v", p)
	}
}

// A Kafka transaction commits at a Postgres transaction boundary at once
// when no complete Postgres transaction waits behind it (a quiet stream),
// and under load only once it is transaction_interval old or holds
// max_buffered_records records (issue 36 section 2).
func TestCommitDue(t *testing.T) {
	limits := Limits{Interval: 100 * time.Millisecond, MaxRecords: 1000}
	for _, c := range []struct {
		name    string
		records int
		age     time.Duration
		waiting bool
		want    bool
	}{
		{"quiet: one record, just opened", 1, 0, false, true},
		{"quiet: old and full", 1000, time.Second, false, true},
		{"load: young and small", 10, 5 * time.Millisecond, true, false},
		{"load: just under the interval", 999, 99 * time.Millisecond, true, false},
		{"load: the interval", 10, 100 * time.Millisecond, true, true},
		{"load: full", 1000, time.Millisecond, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := CommitDue(c.records, c.age, c.waiting, limits); got != c.want {
				t.Errorf("CommitDue(%d records, %s old, waiting %v) = %v, want %v", c.records, c.age, c.waiting, got, c.want)
			}
		})
	}
}
