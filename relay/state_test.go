package relay

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/config"
)

// A relay that leaves streaming (standby, restarting, stopped) has nothing
// in flight: the gauges must not keep the buffer of its last run, or a
// standby would keep an alert on a full buffer firing.
func TestLeavingStreamingClearsInFlightGauges(t *testing.T) {
	r, err := New(config.Default(), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, state := range []State{StateStandby, StateStarting, StateStopped} {
		r.setState(StateStreaming, "")
		r.m.inFlight.Set(9000)
		r.m.bufferFill.Set(0.95)
		r.setState(state, "test")
		if n, fill := testutil.ToFloat64(r.m.inFlight), testutil.ToFloat64(r.m.bufferFill); n != 0 || fill != 0 {
			t.Errorf("after %s: in flight %g, buffer fill %g; want 0 and 0", state, n, fill)
		}
	}
}

// /status shows the confirmed position Postgres applied, apart from the one
// last sent, and a relay that goes to standby shows neither, nor anything in
// flight: the slot is another process's.
func TestStatusPositions(t *testing.T) {
	r, err := New(config.Default(), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r.setState(StateStreaming, "")
	r.SlotConfirmed(0x100)
	r.status.SetPosition("0/200", "0/300", time.Now(), 7)
	s := r.Status()
	if s.ConfirmedLSN != "0/100" || s.SentLSN != "0/200" || s.ReceivedLSN != "0/300" || s.InFlight != 7 {
		t.Errorf("streaming: confirmed %s, sent %s, received %s, in flight %d; want 0/100, 0/200, 0/300, 7",
			s.ConfirmedLSN, s.SentLSN, s.ReceivedLSN, s.InFlight)
	}
	r.setState(StateStarting, "restarting")
	if s := r.Status(); s.InFlight != 0 || s.ReceivedLSN != "" || s.ConfirmedLSN != "0/100" {
		t.Errorf("restarting: in flight %d, received %q, confirmed %q; want 0, none, 0/100", s.InFlight, s.ReceivedLSN, s.ConfirmedLSN)
	}
	r.setState(StateStandby, "another process holds the slot")
	r.SlotConfirmed(0x900) // the slot monitor reads the other holder's position
	if s := r.Status(); s.InFlight != 0 || s.ConfirmedLSN != "" || s.SentLSN != "" || !s.ConfirmedCommitTime.IsZero() {
		t.Errorf("standby: in flight %d, confirmed %q, sent %q, commit time %v; want nothing", s.InFlight, s.ConfirmedLSN, s.SentLSN, s.ConfirmedCommitTime)
	}
}
