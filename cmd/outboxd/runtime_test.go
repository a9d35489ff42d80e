package main

import (
	"math"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/outboxd/outboxd/config"
)

// outboxd runs Go code on one CPU per shard, at most half the CPUs the
// runtime chose and at least one, unless GOMAXPROCS is set (BENCHMARKS.md,
// "One CPU for outboxd"); with GOMAXPROCS set, the runtime's value stays.
func TestDefaultProcs(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	for _, tc := range []struct {
		name, env    string
		shards, cpus int
		want         int
	}{
		{"unset", "", 1, 4, 1},
		{"set", "4", 1, 4, 4},
		{"two shards", "", 2, 4, 2},
		{"two shards on two cpus", "", 2, 2, 1},
		{"four shards on two cpus", "", 4, 2, 1},
		{"one cpu", "", 2, 1, 1},
		{"more shards than half the cpus", "", 8, 4, 2},
		{"sixteen cpus", "", 8, 16, 8},
		{"set with shards", "3", 8, 4, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GOMAXPROCS(4) // what the runtime chose at start
			defaultProcs(tc.env, tc.shards, tc.cpus)
			if got := runtime.GOMAXPROCS(0); got != tc.want {
				t.Errorf("GOMAXPROCS environment %q, %d shards, %d CPUs: GOMAXPROCS = %d, want %d", tc.env, tc.shards, tc.cpus, got, tc.want)
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
		start     int // what the runtime took from GOGC at start
		want      string
	}{
		{"unset", "", 100, "200"},
		{"set", "50", 50, "50"},
		{"off", "off", -1, "off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetGCPercent(tc.start)
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
	kafka := func(bytes, records int) config.Kafka {
		k := def
		k.MaxBufferedBytes, k.MaxBufferedRecords = bytes, records
		return k
	}
	for _, tc := range []struct {
		name, env string
		start     int64 // what the runtime took from GOMEMLIMIT at start
		kafka     config.Kafka
		want      string
		wantBytes int64
	}{
		{"defaults", "", math.MaxInt64, def, "96MiB", 96 << 20},
		{"bytes cap raised", "", math.MaxInt64, kafka(256<<20, 10000), "768MiB", 768 << 20},
		{"records cap raised", "", math.MaxInt64, kafka(32<<20, 100000), "292MiB", 3 * (100000 << 10)},
		{"small caps", "", math.MaxInt64, kafka(1<<20, 1000), "64MiB", 64 << 20},
		{"caps too large to triple", "", math.MaxInt64, kafka(math.MaxInt64/2, 10000), "off", math.MaxInt64},
		{"set", "200MiB", 200 << 20, def, "200MiB", 200 << 20},
		{"set off", "off", math.MaxInt64, def, "off", math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(tc.start)
			got := defaultMemoryLimit(tc.env, tc.kafka)
			if now := debug.SetMemoryLimit(-1); got != tc.want || now != tc.wantBytes {
				t.Errorf("GOMEMLIMIT environment %q: returned %s, in force %d, want %s (%d)", tc.env, got, now, tc.want, tc.wantBytes)
			}
		})
	}
}
