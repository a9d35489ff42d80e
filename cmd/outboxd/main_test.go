package main

import (
	"runtime"
	"testing"
)

// outboxd runs Go code on one CPU unless GOMAXPROCS is set (BENCHMARKS.md,
// "One CPU for outboxd"); with GOMAXPROCS set, the runtime's value stays.
func TestDefaultProcs(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	for _, tc := range []struct {
		name, env string
		want      int
	}{
		{"unset", "", 1},
		{"set", "4", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GOMAXPROCS(4) // what the runtime chose at start
			defaultProcs(tc.env)
			if got := runtime.GOMAXPROCS(0); got != tc.want {
				t.Errorf("GOMAXPROCS environment %q: GOMAXPROCS = %d, want %d", tc.env, got, tc.want)
			}
		})
	}
}
