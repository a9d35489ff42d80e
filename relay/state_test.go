package relay

import (
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

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
	for _, state := range []string{stateStandby, stateStarting, stateStopped} {
		r.setState(stateStreaming, "")
		r.m.inFlight.Set(9000)
		r.m.bufferFill.Set(0.95)
		r.setState(state, "test")
		if n, fill := value(r.m.inFlight), value(r.m.bufferFill); n != 0 || fill != 0 {
			t.Errorf("after %s: in flight %g, buffer fill %g; want 0 and 0", state, n, fill)
		}
	}
}
