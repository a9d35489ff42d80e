package main

import (
	"runtime"
	"testing"
)

// outboxd runs Go code on one CPU unless GOMAXPROCS is set (BENCHMARKS.md,
// "One CPU for outboxd"); an explicit GOMAXPROCS is left to the runtime.
func TestDefaultProcs(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })

	runtime.GOMAXPROCS(4)
	defaultProcs("")
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Errorf("without GOMAXPROCS in the environment: GOMAXPROCS = %d, want 1", got)
	}
	runtime.GOMAXPROCS(4)
	defaultProcs("4")
	if got := runtime.GOMAXPROCS(0); got != 4 {
		t.Errorf("with GOMAXPROCS=4 in the environment: GOMAXPROCS = %d, want 4 (the runtime's reading of it)", got)
	}
}
