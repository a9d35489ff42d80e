package main

import (
	"math"
	"testing"
)

func TestHistogramQuantile(t *testing.T) {
	inf := math.Inf(1)
	for _, tc := range []struct {
		name string
		h    histogram
		q    float64
		want float64
	}{
		{"inside the first bucket", histogram{0.001: 100, 0.002: 100, inf: 100}, 0.5, 0.0005},
		{"interpolated in a later bucket", histogram{0.001: 90, 0.002: 100, inf: 100}, 0.95, 0.0015},
		{"in +Inf: the highest finite bound", histogram{0.001: 10, 0.002: 20, inf: 100}, 0.99, 0.002},
		{"empty", histogram{0.001: 0, inf: 0}, 0.99, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.h.quantile(tc.q); math.Abs(got-tc.want) > 1e-12 {
				t.Errorf("quantile(%g) = %g, want %g", tc.q, got, tc.want)
			}
		})
	}
	// A run's histogram is the end's minus the start's.
	d := histogram{0.001: 15, inf: 20}.minus(histogram{0.001: 5, inf: 5})
	if d[0.001] != 10 || d[inf] != 15 {
		t.Errorf("minus = %v, want 10 and 15", d)
	}
}
