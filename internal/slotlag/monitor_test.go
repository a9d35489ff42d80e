package slotlag

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/testenv"
)

// TestMonitorSlotUnreachable runs the slot monitor against an address nothing
// listens on: every read fails, the error counter rises, the last-read time
// stays unset, one warning is logged with err and slot, and Run
// returns nil when ctx ends.
func TestMonitorSlotUnreachable(t *testing.T) {
	cfg := config.Default()
	cfg.Postgres.DSN = "postgres://outboxd@127.0.0.1:1/app?sslmode=disable&connect_timeout=2"
	cfg.Postgres.Slot = "outboxd_test"
	cfg.Postgres.SlotLagInterval = 100 * time.Millisecond
	var logs testenv.Buffer
	r := New(cfg.Postgres, slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewRegistry())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, nil) }()
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(r.m.readErrors) < 3 {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("outboxd_slot_read_errors_total = %v after 10s, want >= 3", testutil.ToFloat64(r.m.readErrors))
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after ctx was cancelled")
	}

	if v := testutil.ToFloat64(r.m.lastRead); v != 0 {
		t.Errorf("outboxd_slot_last_read_timestamp_seconds = %v, want 0 (never read)", v)
	}
	out := logs.String()
	t.Log(out)
	if n := strings.Count(out, "level=WARN"); n != 1 {
		t.Errorf("%d warnings, want 1 (at most one a minute while reads keep failing)", n)
	}
	for _, want := range []string{"slot=outboxd_test", "err=", "127.0.0.1"} {
		if !strings.Contains(out, want) {
			t.Errorf("the warning lacks %q", want)
		}
	}
}

func TestSlotFailuresThrottle(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var f slotFailures
	for i, tc := range []struct {
		at      time.Duration // after t0; -1 is a successful read
		wantN   int
		wantLog bool
	}{
		{0, 1, true}, // the first failure is logged at once
		{10 * time.Second, 2, false},
		{50 * time.Second, 3, false},
		{60 * time.Second, 4, true}, // a minute later, again
		{90 * time.Second, 5, false},
		{-1, 5, true},                // recovery reports the 5 failures
		{100 * time.Second, 1, true}, // a new run of failures logs at once
		{-1, 1, true},
		{-1, 0, false}, // a success after a success logs nothing
	} {
		var n int
		var logged bool
		if tc.at < 0 {
			n, logged = f.succeeded()
		} else {
			n, logged = f.failed(t0.Add(tc.at))
		}
		if n != tc.wantN || logged != tc.wantLog {
			t.Errorf("step %d: (%d, %v), want (%d, %v)", i, n, logged, tc.wantN, tc.wantLog)
		}
	}
}

func TestSlotReadSetsGauges(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry())
	i64 := func(v int64) *int64 { return &v }
	pid, status := int32(4242), "extended"
	before := float64(time.Now().Unix())
	m.read(slotReading{lag: i64(100), retained: i64(5000), safeWAL: i64(1 << 30), active: true, pid: &pid, walStatus: &status})
	for name, tc := range map[string]struct {
		g    prometheus.Collector
		want float64
	}{
		"lag":      {m.lag, 100},
		"retained": {m.retained, 5000},
		"safe":     {m.safeWAL, 1 << 30},
		"active":   {m.active, 1},
		"pid":      {m.pid, 4242},
		"extended": {m.walStatus.WithLabelValues("extended"), 1},
		"reserved": {m.walStatus.WithLabelValues("reserved"), 0},
	} {
		if got := testutil.ToFloat64(tc.g); got != tc.want {
			t.Errorf("%s = %v, want %v", name, got, tc.want)
		}
	}
	if got := testutil.ToFloat64(m.lastRead); got < before {
		t.Errorf("last read %v, want >= %v", got, before)
	}
}
