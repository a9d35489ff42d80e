package backfill

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/eos"
)

// Where an exactly-once backfill goes on from after a kill: Kafka's cursor,
// committed with the rows, wins over the one Postgres saved after it
// (issue 35 §2: "in exactly-once mode repeating nothing").
func TestResume(t *testing.T) {
	started := time.Date(2026, 1, 1, 0, 0, 0, 123456789, time.UTC)
	pg := State{Slot: "outboxd", LSN: "0/1500", Started: started, Phase: phaseSending, Keys: []string{"created_at", "id"},
		Done: []string{"2026-01-01 00:00:00.0001+00", "100"}, Sent: 100, Total: 1000}
	ahead := pg
	ahead.Done, ahead.Sent = []string{"2026-01-01 00:00:00.0004+00", "400"}, 400
	all := pg
	all.Done, all.Sent = []string{"2026-01-01 00:00:00.001+00", "1000"}, 1000
	fresh := pg
	fresh.Done, fresh.Sent = nil, 0
	other := ahead
	other.LSN = "0/1400"
	restarted := ahead
	restarted.Started = started.Add(time.Second)
	behind := pg
	behind.Done, behind.Sent = []string{"2026-01-01 00:00:00.00005+00", "50"}, 50
	kafka := func(st State, done bool) Committed {
		return Committed{Found: true, Position: eos.Position{Slot: "outboxd", System: "7441", Backfill: cursorOf(st, done)}}
	}
	for _, tt := range []struct {
		name      string
		pg        State
		k         Committed
		want      State
		finished  bool
		fromKafka bool
		note      string // a part of the note, "" for none
	}{
		{name: "first run, nothing anywhere", pg: fresh, want: fresh},
		{name: "Postgres lags Kafka: Kafka's cursor", pg: pg, k: kafka(ahead, false), want: ahead, fromKafka: true},
		{name: "both at the same rows", pg: pg, k: kafka(pg, false), want: pg, fromKafka: true},
		{name: "done in Kafka, not in Postgres: nothing sent, done recorded", pg: pg, k: kafka(all, true), want: all, finished: true, fromKafka: true},
		{name: "a first run killed after its first commit", pg: fresh, k: kafka(ahead, false), want: ahead, fromKafka: true},
		{name: "no position: began in at_least_once", pg: pg, k: Committed{}, want: pg, note: "Kafka holds no cursor"},
		{name: "a stream position of an earlier slot, no cursor", pg: pg, k: Committed{Found: true, Position: eos.Position{LSN: 0x1400, Slot: "outboxd"}},
			want: pg, note: "Kafka holds no cursor"},
		{name: "an earlier slot's backfill", pg: pg, k: kafka(other, true), want: pg, note: "another backfill's"},
		{name: "a backfill started again on a slot at the same point", pg: pg, k: kafka(restarted, false), want: pg, note: "another backfill's"},
		{name: "Kafka behind Postgres", pg: pg, k: kafka(behind, false), want: pg, note: "behind the one Postgres recorded"},
		// The cluster's position from before a promotion or a restore, past
		// the new slot's consistent point (review-fix55 Should 2).
		{name: "a stream position of an earlier timeline", pg: pg, k: Committed{Found: true, Position: eos.Position{LSN: 0x9000, Timeline: 1, Slot: "outboxd"},
			Server: eos.Server{Timeline: 2, WALEnd: 0x2000}}, want: pg, note: "on timeline 1, an earlier one than the server's (2)"},
		// What an operator's tombstone reads as (eos.Read): no position.
		{name: "a tombstone", pg: pg, k: Committed{Found: false, Server: eos.Server{Timeline: 2, WALEnd: 0x2000}}, want: pg, note: "Kafka holds no cursor"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resume(tt.pg, tt.k, storeIn("public", "outboxd"))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Done, tt.want.Done) || got.Sent != tt.want.Sent || got.LSN != tt.want.LSN || !got.Started.Equal(tt.want.Started) {
				t.Errorf("resumes after %v (%d rows), want after %v (%d rows)", got.Done, got.Sent, tt.want.Done, tt.want.Sent)
			}
			if got.finished != tt.finished || got.fromKafka != tt.fromKafka {
				t.Errorf("finished %v, from Kafka %v; want %v, %v", got.finished, got.fromKafka, tt.finished, tt.fromKafka)
			}
			if (tt.note == "") != (got.note == "") || !strings.Contains(got.note, tt.note) {
				t.Errorf("note %q, want one with %q", got.note, tt.note)
			}
		})
	}
	// A stream position of this slot at or past its consistent point was
	// written by a second process that streamed the slot while the
	// backfill was not done (review-eosbf S2).
	// On the server's timeline, or with none recorded (an older outboxd's
	// position), it is refused whatever the timeline; the message gives the
	// two ways out, not a restart, which reads it again (review-fix55
	// Should 1, 2).
	for _, tt := range []struct {
		pos    eos.Position
		server eos.Server
		why    string
	}{
		{eos.Position{LSN: 0x1500}, eos.Server{}, "another outboxd process streamed the slot"},
		{eos.Position{LSN: 0x1600}, eos.Server{Timeline: 2, WALEnd: 0x2000}, "another outboxd process streamed the slot"},
		{eos.Position{LSN: 0x1600, Timeline: 2}, eos.Server{Timeline: 2, WALEnd: 0x2000}, "another outboxd process streamed the slot"},
		{eos.Position{LSN: 0x1600, Timeline: 1}, eos.Server{Timeline: 1, WALEnd: 0x2000}, "another outboxd process streamed the slot"},
		{eos.Position{LSN: 0x3000, Timeline: 2}, eos.Server{Timeline: 2, WALEnd: 0x2000}, "past the server's WAL end at this start (0/2000)"},
	} {
		t.Run(fmt.Sprintf("a stream position at %s on timeline %d, past the slot's start, server on %d", tt.pos.LSN, tt.pos.Timeline, tt.server.Timeline), func(t *testing.T) {
			tt.pos.Slot = "outboxd"
			k := Committed{Found: true, Owner: eos.Owner{ID: "outboxd-7441-outboxd", Topic: "outboxd-positions"}, Position: tt.pos, Server: tt.server}
			_, err := resume(pg, k, storeIn("public", "outboxd"))
			var se *StreamedError
			if !errors.As(err, &se) || !se.Permanent() || !strings.Contains(err.Error(), tt.why) {
				t.Fatalf("resume = %v; want a permanent *StreamedError saying %q", err, tt.why)
			}
			for _, want := range []string{
				`write a tombstone for key "outboxd-7441-outboxd" to outboxd-positions`,
				`DELETE FROM "public"."outboxd_backfill" WHERE slot = 'outboxd'; DROP TABLE IF EXISTS "public"."outboxd_backfill_outboxd"`,
				"A restart reads the same position again",
			} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal does not say %q: %v", want, err)
				}
			}
		})
	}
	t.Run("a cursor not outboxd's", func(t *testing.T) {
		k := Committed{Found: true, Owner: eos.Owner{ID: "outboxd-7441-outboxd", Topic: "outboxd-positions"},
			Position: eos.Position{Slot: "outboxd", Backfill: `"not a cursor"`}}
		_, err := resume(pg, k, storeIn("public", "outboxd"))
		var ce *CursorError
		if !errors.As(err, &ce) || !ce.Permanent() || !strings.Contains(err.Error(), "outboxd-7441-outboxd") {
			t.Errorf("resume = %v; want a permanent *CursorError naming the transactional id", err)
		}
	})
	// review-fix55 N6: a restart would read the same state row again.
	t.Run("a consistent point in Postgres that is not an LSN", func(t *testing.T) {
		k := Committed{Found: true, Owner: eos.Owner{ID: "outboxd-7441-outboxd", Topic: "outboxd-positions"},
			Position: eos.Position{Slot: "outboxd", LSN: 0x3000}}
		_, err := resume(State{Slot: "outboxd", LSN: "not an lsn"}, k, storeIn("public", "outboxd"))
		var se *StateError
		if !errors.As(err, &se) || !se.Permanent() {
			t.Fatalf("resume = %v; want a permanent *StateError", err)
		}
		for _, want := range []string{`"not an lsn"`, `it is the lsn of outboxd's log line "created replication slot with the backfill's snapshot" for slot outboxd`, `DELETE FROM "public"."outboxd_backfill" WHERE slot = 'outboxd'; DROP TABLE IF EXISTS "public"."outboxd_backfill_outboxd"`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the refusal does not say %q: %v", want, err)
			}
		}
	})
}

// A cursor survives the position record's encoding (eos.Position.Encode)
// exactly, its start time to the nanosecond.
func TestCursorThroughThePosition(t *testing.T) {
	st := State{LSN: "0/1500", Started: time.Date(2026, 1, 1, 0, 0, 0, 123456789, time.UTC), Done: []string{"a,b", `"q"`}, Sent: 7}
	raw := eos.Position{Slot: "s", System: "1", Backfill: cursorOf(st, true)}.Encode(time.Now())
	pos, err := eos.DecodePosition(raw)
	if err != nil {
		t.Fatal(err)
	}
	got, err := resume(State{LSN: st.LSN, Started: st.Started}, Committed{Found: true, Position: pos}, storeIn("public", "s"))
	if err != nil || !got.fromKafka || !got.finished || got.Sent != 7 || !slices.Equal(got.Done, st.Done) {
		t.Errorf("resume from %s = %+v, %v", raw, got, err)
	}
}

// An exactly-once backfill's Kafka transaction commits before the next row
// where the stream's would split a Postgres transaction.
func TestSplit(t *testing.T) {
	l := eos.Limits{MaxRecords: 1000, MaxBytes: 1 << 20, MaxAge: 5 * time.Second}
	for _, tt := range []struct {
		name           string
		records, bytes int
		age            time.Duration
		want           bool
	}{
		{"small and young", 10, 1000, time.Millisecond, false},
		{"max_buffered_records", 1000, 1000, time.Millisecond, true},
		{"transaction_max_bytes", 10, 1 << 20, time.Millisecond, true},
		{"half the transaction timeout", 10, 1000, 5 * time.Second, true},
	} {
		if got := split(tt.records, tt.bytes, tt.age, l); got != tt.want {
			t.Errorf("%s: split = %v, want %v", tt.name, got, tt.want)
		}
	}
}
