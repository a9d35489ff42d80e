package main

import (
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/outboxd/outboxd/config"
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

// The garbage collector runs at GOGC=200 unless GOGC is set (BENCHMARKS.md,
// "A lazier garbage collector").
func TestDefaultGC(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })
	for _, tc := range []struct {
		name, env string
		want      string
	}{
		{"unset", "", "200"},
		{"set", "50", "50"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetGCPercent(50) // what the runtime took from GOGC=50 at start
			defaultGC(tc.env)
			if got := gcPercent(); got != tc.want {
				t.Errorf("GOGC environment %q: GOGC = %s, want %s", tc.env, got, tc.want)
			}
		})
	}
}

// The soft memory limit follows the in-flight caps unless GOMEMLIMIT is set.
func TestDefaultMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	def := config.Default().Kafka
	manyRecords := def
	manyRecords.MaxBufferedRecords = 100000
	moreBytes := def
	moreBytes.MaxBufferedBytes = 256 << 20
	for _, tc := range []struct {
		name, env string
		kafka     config.Kafka
		want      int64
	}{
		{"defaults", "", def, 96 << 20},
		{"bytes cap raised", "", moreBytes, 768 << 20},
		{"records cap raised", "", manyRecords, 3 * 100000 << 10},
		{"set", "200MiB", def, 200 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(200 << 20) // what the runtime took from GOMEMLIMIT=200MiB at start
			got := defaultMemoryLimit(tc.env, tc.kafka)
			if now := debug.SetMemoryLimit(-1); got != tc.want || now != tc.want {
				t.Errorf("GOMEMLIMIT environment %q: returned %d, in force %d, want %d", tc.env, got, now, tc.want)
			}
		})
	}
}
