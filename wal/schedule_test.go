package wal

import (
	"testing"
	"time"
)

// TestScheduleCoalescesConfirmations drives the status schedule with an
// injected clock: a keepalive every interval whatever the position; between
// them a new position at the first look a gap after the last update; looks
// only while something received is unconfirmed, at most one per gap.
func TestScheduleCoalescesConfirmations(t *testing.T) {
	type op struct {
		at       int  // ms since the start
		waiting  bool // a received transaction is unconfirmed
		advanced bool // what advanced would answer
		want     step
		looks    bool // whether at may call advanced
		next     int  // when the stream must look next, after the op (ms; -1: not checked)
	}
	names := map[step]string{wait: "wait", keepalive: "keepalive", confirm: "confirm"}
	for _, c := range []struct {
		name          string
		interval, gap int
		ops           []op
	}{
		{"confirmations between keepalives", 1000, 50, []op{
			{at: 0, want: wait, next: 1000},                                               // nothing received: sleep until the keepalive
			{at: 10, waiting: true, advanced: true, want: confirm, looks: true, next: 60}, // the first look is free
			{at: 20, waiting: true, advanced: true, want: wait, next: 60},                 // coalesced: within a gap of the last update
			{at: 59, waiting: true, advanced: true, want: wait, next: 60},
			{at: 60, waiting: true, want: wait, looks: true, next: 110}, // looked, nothing new: look again a gap later
			{at: 100, waiting: true, advanced: true, want: wait, next: 110},
			{at: 110, waiting: true, advanced: true, want: confirm, looks: true, next: 160},
			{at: 500, want: wait, next: 1000}, // all confirmed: no looks
			{at: 1000, waiting: true, advanced: true, want: keepalive, next: 1050},
			{at: 1010, waiting: true, advanced: true, want: wait, next: 1050}, // a keepalive starts a gap too
			{at: 1050, waiting: true, advanced: true, want: confirm, looks: true, next: 1100},
			{at: 2000, want: keepalive, next: 3000}, // the keepalive goes whatever the position
			{at: 2990, waiting: true, advanced: true, want: confirm, looks: true, next: 3000},
			{at: 3000, waiting: true, want: keepalive, next: 3050},
		}},
		{"a late look sends at once", 1000, 100, []op{
			{at: 0, waiting: true, advanced: true, want: confirm, looks: true, next: 100},
			{at: 700, waiting: true, advanced: true, want: confirm, looks: true, next: 800}, // the stream was busy: no added wait
		}},
		{"gap 0 confirms only with keepalives", 1000, 0, []op{
			{at: 0, waiting: true, advanced: true, want: wait, next: 1000},
			{at: 999, waiting: true, advanced: true, want: wait, next: 1000},
			{at: 1000, waiting: true, advanced: true, want: keepalive, next: 2000},
		}},
		{"a gap at or past the interval leaves it to the keepalive", 100, 250, []op{
			{at: 0, waiting: true, advanced: true, want: confirm, looks: true, next: 100},
			{at: 100, waiting: true, advanced: true, want: keepalive, next: 200},
			{at: 150, waiting: true, advanced: true, want: wait, next: 200},
			{at: 200, waiting: true, advanced: true, want: keepalive, next: 300},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
			s := newSchedule(t0, time.Duration(c.interval)*time.Millisecond, time.Duration(c.gap)*time.Millisecond)
			for _, o := range c.ops {
				looked := false
				got := s.at(ms(o.at), o.waiting, func() bool { looked = true; return o.advanced })
				if got != o.want {
					t.Fatalf("at %dms: %s, want %s", o.at, names[got], names[o.want])
				}
				if looked != o.looks {
					t.Errorf("at %dms: looked at the position: %v, want %v", o.at, looked, o.looks)
				}
				if got != wait {
					s.sent(ms(o.at))
				}
				if o.next >= 0 {
					if next := s.next(o.waiting); !next.Equal(ms(o.next)) {
						t.Errorf("after %dms: next look at %s, want %dms", o.at, next.Sub(t0), o.next)
					}
				}
			}
		})
	}
}
