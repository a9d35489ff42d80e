package replay

import (
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		name  string
		rate  float64
		calls []time.Duration // the time of each call, from t0
		want  []time.Duration // the delays returned
	}{
		{"no limit", 0, []time.Duration{0, 0, 0}, []time.Duration{0, 0, 0}},
		{"spaced at the rate", 100, []time.Duration{0, 0, 0}, []time.Duration{0, ms(10), ms(20)}},
		{"calls that came late are not delayed", 100, []time.Duration{0, ms(50), ms(50)}, []time.Duration{0, 0, ms(10)}},
		// Time spent elsewhere is not made up with a burst.
		{"no burst after a pause", 100, []time.Duration{0, ms(10), ms(1000), ms(1000)}, []time.Duration{0, 0, 0, ms(10)}},
		// Below a millisecond the delay is carried into the next one.
		{"small delays carried", 2000, []time.Duration{0, 0, 0, 0}, []time.Duration{0, 0, ms(1), ms(1) + 500*time.Microsecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPacer(tc.rate)
			for i, at := range tc.calls {
				if got := p.delay(t0.Add(at)); got != tc.want[i] {
					t.Fatalf("call %d at %s: delay %s, want %s", i, at, got, tc.want[i])
				}
			}
		})
	}
}
