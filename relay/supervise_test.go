package relay

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/wal"
)

// fakeClock is a clock whose Sleep returns at once, moving the time on.
type fakeClock struct {
	now    time.Time
	sleeps []time.Duration
}

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return true
}

// step is one scripted pipeline run: it lasts took, then ends with err
// and out; with stop, a shutdown (SIGTERM) comes while it runs.
type step struct {
	took time.Duration
	err  error
	out  outcome
	stop bool
}

// TestSuperviseRules: Run's rules over pipeline runs, with the runs and
// the clock scripted: the backoff doubles from 500 ms to 10 s and starts
// again after a run of more than a minute; a held slot or a reshard under
// way is waited for as a standby, polling every standby_poll_interval; a
// permanent error ends Run at once, a retriable one restarts; a shutdown
// is a clean stop unless the error is permanent (issue 34 item 2).
func TestSuperviseRules(t *testing.T) {
	const poll = 3 * time.Second
	retriable := errors.New("connection reset")
	permanent := &router.LayoutError{Table: "public.outbox", Missing: []string{"payload"}}
	held := &wal.SlotActiveError{Slot: "outboxd", PID: 42}
	ms := time.Millisecond
	for _, tc := range []struct {
		name   string
		drain  bool
		steps  []step // then a shutdown, as a run that ends cleanly
		sleeps []time.Duration
		err    error // what Run returns
		done   bool  // an old shard delivered its window
		// standby: per run, whether the supervisor handed it the standby
		// poll connection (it was standing by).
		standby  []bool
		restarts float64
		state    State // after the last scripted run, before the shutdown
	}{
		{name: "backoff doubles up to 10 s",
			steps:    []step{{err: retriable}, {err: retriable}, {err: retriable}, {err: retriable}, {err: retriable}, {err: retriable}, {err: retriable}},
			sleeps:   []time.Duration{500 * ms, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second},
			restarts: 7, state: StateStarting},
		{name: "backoff starts again after a run of more than a minute",
			steps:    []step{{err: retriable}, {err: retriable}, {took: 61 * time.Second, err: retriable}, {err: retriable}},
			sleeps:   []time.Duration{500 * ms, time.Second, 500 * ms, time.Second},
			restarts: 4, state: StateStarting},
		{name: "a run of a minute exactly keeps the backoff",
			steps:    []step{{err: retriable}, {took: time.Minute, err: retriable}},
			sleeps:   []time.Duration{500 * ms, time.Second},
			restarts: 2, state: StateStarting},
		{name: "a stream that ends without an error is restarted",
			steps:    []step{{}},
			sleeps:   []time.Duration{500 * ms},
			restarts: 1, state: StateStarting},
		{name: "permanent error ends Run at once",
			steps: []step{{err: retriable}, {err: permanent}},
			// no sleep after the permanent error, and no shutdown run
			sleeps: []time.Duration{500 * ms}, err: permanent, restarts: 1},
		{name: "standby polls while the slot is held, then takes over",
			steps:   []step{{err: held}, {err: held}, {err: retriable}},
			sleeps:  []time.Duration{poll, poll, 500 * ms},
			standby: []bool{false, true, true, false}, restarts: 1, state: StateStarting},
		{name: "a reshard under way is waited for as a standby",
			steps:   []step{{err: &ReshardWaitError{Reason: "the slot is an old shard's"}}},
			sleeps:  []time.Duration{poll},
			standby: []bool{false, true}, state: StateStandby},
		{name: "another instance's reshard: this one stands by once its window is delivered",
			steps:   []step{{out: outcome{windowDelivered: true, cutover: 0x400}}},
			sleeps:  []time.Duration{poll},
			standby: []bool{false, true}, state: StateStandby},
		{name: "an old shard drained by this process ends with its window",
			drain: true, steps: []step{{err: retriable}, {out: outcome{windowDelivered: true, cutover: 0x400}}},
			sleeps: []time.Duration{500 * ms}, done: true, restarts: 1},
		{name: "shutdown during a run that fails retriably is a clean stop",
			steps:  []step{{err: retriable, stop: true}},
			sleeps: nil},
		{name: "shutdown during a run that fails permanently returns the error",
			steps: []step{{err: permanent, stop: true}},
			err:   permanent},
		{name: "shutdown while standing by is a clean stop",
			steps:  []step{{err: held}, {err: held, stop: true}},
			sleeps: []time.Duration{poll}, standby: []bool{false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Postgres.StandbyPollInterval = poll
			reg := prometheus.NewRegistry()
			r, err := New(cfg, slog.New(slog.DiscardHandler), reg)
			if err != nil {
				t.Fatal(err)
			}
			r.drain = tc.drain
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			var standby []bool
			var state State
			n := 0
			run := func(ctx context.Context, a attempt) (outcome, error) {
				if (n == 0) != (a.first != nil) || a.history == nil {
					t.Errorf("run %d: first %v, history %v; want the checks' value for the first run only, and a history", n, a.first != nil, a.history != nil)
				}
				standby = append(standby, a.standby != nil)
				if n == len(tc.steps) {
					state = r.Status().State
					stop() // the shutdown: a run ends cleanly
					return outcome{}, nil
				}
				s := tc.steps[n]
				n++
				clock.now = clock.now.Add(s.took)
				if s.stop {
					stop()
				}
				return s.out, s.err
			}
			ended, err := r.supervise(ctx, &Checked{}, run, clock)
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Errorf("supervise = %v, want %v", err, tc.err)
			}
			if ended.windowDelivered != tc.done {
				t.Errorf("window delivered %v, want %v", ended.windowDelivered, tc.done)
			}
			if !slices.Equal(clock.sleeps, tc.sleeps) {
				t.Errorf("slept %v, want %v", clock.sleeps, tc.sleeps)
			}
			if tc.standby != nil && !slices.Equal(standby[:min(len(standby), len(tc.standby))], tc.standby) {
				t.Errorf("standby per run %v, want %v", standby, tc.standby)
			}
			if got := testutil.ToFloat64(r.m.restarts); got != tc.restarts {
				t.Errorf("%v restarts counted, want %v", got, tc.restarts)
			}
			if tc.state != "" && state != tc.state {
				t.Errorf("state before the shutdown %s, want %s", state, tc.state)
			}
			if st := r.Status(); st.State != StateStopped {
				t.Errorf("state after Run %s, want stopped", st.State)
			}
			if tc.err != nil && !strings.Contains(r.Status().LastError, tc.err.Error()) && !tc.steps[len(tc.steps)-1].stop {
				t.Errorf("last error %q, want %q", r.Status().LastError, tc.err)
			}
		})
	}
}

// TestSuperviseReshardReason: the standby reason after another instance's
// reshard names the cutover the run took.
func TestSuperviseReshardReason(t *testing.T) {
	r, err := New(config.Default(), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var reason string
	n := 0
	run := func(ctx context.Context, a attempt) (outcome, error) {
		n++
		if n == 1 {
			return outcome{windowDelivered: true, cutover: 0x400}, nil
		}
		reason = r.Status().Reason
		stop()
		return outcome{}, nil
	}
	if _, err := r.supervise(ctx, nil, run, &fakeClock{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "cutover 0/400") {
		t.Errorf("standby reason %q, want the cutover 0/400", reason)
	}
}
