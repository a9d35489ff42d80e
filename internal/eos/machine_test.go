package eos

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/outboxd/outboxd/wal"
)

// TestScripts runs the scripts in testdata: the inputs of one or more runs
// (a position read from Kafka, the server, the stream's events and the
// clock) and the actions the Machine returns, the way etcd raft tests
// RawNode. go test ./internal/eos -rewrite rewrites the expected output;
// read the diff before committing it.
//
// Commands (LSNs as Postgres prints them, durations as Go parses them):
//
//	config [max-records=N] [max-bytes=N] [interval=D] [max-age=D] [slot=S] [system=S] [timeline=N]
//	server timeline=N wal-end=LSN [history=(OLD:SWITCH, ...)]
//	read [id=S] [topic=S]         the input is the value in the positions topic ("" a tombstone)
//	position lsn=LSN [txn=LSN rows=N] [timeline=N] [slot=S] [system=S]   read as it would be encoded
//	start [slot-confirmed=LSN]    resume from what was read (or the slot) and create the Machine
//	restart [slot-confirmed=LSN]  read the last committed position back and start again
//	begin final=LSN [pending=N] | row [size=N] | commit end=LSN | boundary [waiting]
//	advance D | tick | due | finish
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := newHarness()
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			out, err := h.run(t, td)
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			if out == "" {
				out = "ok"
			}
			return out + "\n"
		})
	})
}

// harness is one script's state: the configuration, the server, the clock,
// the Machine of the current run and what it last committed.
type harness struct {
	limits   Limits
	slot     string
	system   string
	timeline int
	server   Server
	history  map[int]wal.LSN
	epoch    time.Time
	now      time.Time

	read      Position // the position read from Kafka
	found     bool
	readErr   error
	machine   *Machine
	committed Position // the last position committed
	commits   int
}

func newHarness() *harness {
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := &harness{limits: Limits{MaxRecords: 1000, MaxBytes: 1 << 20, Interval: 100 * time.Millisecond, MaxAge: 10 * time.Second},
		slot: "outboxd", system: "7441234567890123456", timeline: 1, epoch: epoch, now: epoch, history: map[int]wal.LSN{}}
	h.server = Server{Timeline: 1, WALEnd: 0xFFFF_FFFF, End: h.end}
	return h
}

func (h *harness) end(old int) (wal.LSN, bool, error) {
	lsn, ok := h.history[old]
	return lsn, ok, nil
}

func (h *harness) run(t *testing.T, td *datadriven.TestData) (string, error) {
	switch td.Cmd {
	case "config":
		td.MaybeScanArgs(t, "max-records", &h.limits.MaxRecords)
		td.MaybeScanArgs(t, "max-bytes", &h.limits.MaxBytes)
		scanDuration(t, td, "interval", &h.limits.Interval)
		scanDuration(t, td, "max-age", &h.limits.MaxAge)
		td.MaybeScanArgs(t, "slot", &h.slot)
		td.MaybeScanArgs(t, "system", &h.system)
		td.MaybeScanArgs(t, "timeline", &h.timeline)
		return "", nil
	case "server":
		td.MaybeScanArgs(t, "timeline", &h.server.Timeline)
		scanLSN(t, td, "wal-end", &h.server.WALEnd)
		h.history = map[int]wal.LSN{}
		if arg, ok := td.Arg("history"); ok {
			for _, v := range arg.Vals {
				old, at, ok := strings.Cut(v, ":")
				tli, err := strconv.Atoi(old)
				if !ok || err != nil {
					t.Fatalf("%s: history wants OLD:SWITCH, got %q", td.Pos, v)
				}
				h.history[tli] = parseLSN(t, at)
			}
		}
		return "", nil
	case "read":
		return h.readValue(t, td, []byte(strings.TrimSpace(td.Input)))
	case "position":
		var p Position
		scanLSN(t, td, "lsn", &p.LSN)
		scanLSN(t, td, "txn", &p.Txn)
		td.MaybeScanArgs(t, "rows", &p.Rows)
		td.MaybeScanArgs(t, "timeline", &p.Timeline)
		td.MaybeScanArgs(t, "slot", &p.Slot)
		td.MaybeScanArgs(t, "system", &p.System)
		return h.readValue(t, td, p.Encode(h.now))
	case "start":
		return h.start(t, td)
	case "restart":
		if h.commits == 0 {
			t.Fatalf("%s: restart before any commit", td.Pos)
		}
		if _, err := h.readValue(t, td, h.committed.Encode(h.now)); err != nil {
			return "", err
		}
		return h.start(t, td)
	case "advance":
		if len(td.CmdArgs) != 1 {
			t.Fatalf("%s: advance wants a duration", td.Pos)
		}
		d, err := time.ParseDuration(td.CmdArgs[0].Key)
		if err != nil {
			t.Fatalf("%s: %v", td.Pos, err)
		}
		h.now = h.now.Add(d)
		return "", nil
	case "due":
		at, ok := h.machine.Due()
		if !ok {
			return "nothing due", nil
		}
		return fmt.Sprintf("due at +%s (in %s)", at.Sub(h.epoch), at.Sub(h.now)), nil
	}
	if h.machine == nil {
		t.Fatalf("%s: %s before start", td.Pos, td.Cmd)
	}
	var s Step
	switch td.Cmd {
	case "begin":
		var final wal.LSN
		pending := 0
		scanLSN(t, td, "final", &final)
		td.MaybeScanArgs(t, "pending", &pending)
		s = h.machine.Begin(final, pending)
	case "row":
		size := 0
		td.MaybeScanArgs(t, "size", &size)
		s = h.machine.Row(h.now, size)
	case "commit":
		var end wal.LSN
		scanLSN(t, td, "end", &end)
		s = h.machine.Commit(end)
	case "boundary":
		s = h.machine.Boundary(h.now, td.HasArg("waiting"))
	case "tick":
		s = h.machine.Tick(h.now)
	case "finish":
		s = h.machine.Finish()
	default:
		t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
	}
	if s.Commit {
		h.committed, h.commits = s.Position, h.commits+1
		if p := s.Position; p.Slot != h.slot || p.System != h.system || p.Timeline != h.timeline {
			t.Errorf("%s: committed a position for slot %q, system %q, timeline %d; want the run's %q, %q, %d",
				td.Pos, p.Slot, p.System, p.Timeline, h.slot, h.system, h.timeline)
		}
	}
	return describe(s), nil
}

// readValue judges value as the run reads it from the positions topic.
func (h *harness) readValue(t *testing.T, td *datadriven.TestData, value []byte) (string, error) {
	owner := Owner{Slot: h.slot, System: h.system, ID: "outboxd-" + h.system + "-" + h.slot, Topic: "outboxd-positions"}
	td.MaybeScanArgs(t, "id", &owner.ID)
	td.MaybeScanArgs(t, "topic", &owner.Topic)
	h.read, h.found, h.readErr = Read(value, owner)
	var refused *RefusedError
	var foreign *ForeignError
	switch {
	case errors.As(h.readErr, &refused):
		return "refused (permanent " + strconv.FormatBool(refused.Permanent()) + "): " + h.readErr.Error(), nil
	case errors.As(h.readErr, &foreign):
		return "not outboxd's: " + h.readErr.Error(), nil
	case h.readErr != nil:
		return "", h.readErr
	case !h.found:
		return "no position", nil
	}
	return "found " + positionString(h.read), nil
}

// start resumes from the position read, if any, on the server, and starts
// a run's Machine with the tracker's confirmed position: the slot's, or
// the resumed position when it is past it (tracker.Idle).
func (h *harness) start(t *testing.T, td *datadriven.TestData) (string, error) {
	if h.readErr != nil {
		return "", fmt.Errorf("the run does not start: %w", h.readErr)
	}
	var slotConfirmed wal.LSN
	scanLSN(t, td, "slot-confirmed", &slotConfirmed)
	var resumed Resumed
	var out []string
	if h.found {
		var err error
		if resumed, err = Resume(h.read, h.server, "outboxd-positions"); err != nil {
			return "", err
		}
		line := "resume " + positionString(resumed.Position)
		if resumed.Moved {
			line += fmt.Sprintf(" (moved back to the switch point %s)", resumed.Switch)
		}
		if resumed.Dropped {
			line += fmt.Sprintf(" (split marker %s dropped: it committed at or after the switch point %s)", h.read.Txn, resumed.Switch)
		}
		out = append(out, line)
	} else {
		out = append(out, "no position: resume from the slot")
	}
	confirmed := max(slotConfirmed, resumed.LSN)
	out = append(out, "confirmed "+confirmed.String())
	h.machine = New(h.limits, h.slot, h.system, h.timeline, resumed.Position, confirmed)
	return strings.Join(out, "\n"), nil
}

// describe prints a step's actions in the order the caller carries them out.
func describe(s Step) string {
	var out []string
	if s.Skip {
		out = append(out, "skip")
	}
	if s.Commit { // the slot, system and timeline are the run's (checked in run)
		p := s.Position
		p.Slot, p.System, p.Timeline = "", "", 0
		out = append(out, "commit "+positionString(p))
	}
	if s.Release > 0 {
		out = append(out, fmt.Sprintf("release %d", s.Release))
	}
	if s.Open {
		out = append(out, "open")
	}
	return strings.Join(out, "\n")
}

func positionString(p Position) string {
	s := "lsn=" + p.LSN.String()
	if p.Txn != 0 {
		s += fmt.Sprintf(" txn=%s rows=%d", p.Txn, p.Rows)
	}
	if p.Timeline != 0 {
		s += fmt.Sprintf(" timeline=%d", p.Timeline)
	}
	if p.Slot != "" {
		s += " slot=" + p.Slot
	}
	if p.System != "" {
		s += " system=" + p.System
	}
	if p.Backfill != "" {
		s += " backfill=" + p.Backfill
	}
	return s
}

func scanDuration(t *testing.T, td *datadriven.TestData, key string, dest *time.Duration) {
	var s string
	if td.MaybeScanArgs(t, key, &s) {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s: %s: %v", td.Pos, key, err)
		}
		*dest = d
	}
}

func scanLSN(t *testing.T, td *datadriven.TestData, key string, dest *wal.LSN) {
	var s string
	if td.MaybeScanArgs(t, key, &s) {
		*dest = parseLSN(t, s)
	}
}

func parseLSN(t *testing.T, s string) wal.LSN {
	lsn, err := wal.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}
