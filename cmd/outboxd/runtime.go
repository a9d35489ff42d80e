package main

import (
	"math"
	"runtime"
	"runtime/debug"
	runtimemetrics "runtime/metrics"
	"strconv"

	"github.com/outboxd/outboxd/config"
)

// The Go runtime's settings that outboxd chooses when the environment does
// not. Each default applies unless its own variable (GOMAXPROCS, GOGC,
// GOMEMLIMIT) is set; GOGC=100 GOMEMLIMIT=off restores Go's own defaults for
// the collector.

// minMemoryLimit is the lowest soft memory limit outboxd sets itself: below
// it, small in-flight caps would make the collector run almost constantly.
const minMemoryLimit = 64 << 20

// runtimeProcs is the GOMAXPROCS the Go runtime chose at start (from the
// CPUs the process may use, its cgroup's CPU limit included), before
// outboxd changes it.
var runtimeProcs = runtime.GOMAXPROCS(0)

// defaultProcs runs Go code on one CPU per shard (postgres.shards), at most
// half the CPUs the runtime chose and at least one, unless the GOMAXPROCS
// environment variable says otherwise. Each shard's work arrives as one
// stream from one walsender, and outboxd needs less CPU per event than the
// walsenders and the broker it shares a host with; more Ps than that wake
// more threads and make smaller produce batches, which costs the broker too
// (BENCHMARKS.md, "One CPU for outboxd" and the sharded end-to-end runs).
func defaultProcs(env string, shards, cpus int) {
	if env == "" {
		runtime.GOMAXPROCS(max(1, min(shards, cpus/2)))
	}
}

// defaultGC lets the heap grow to three times what is live before the
// garbage collector runs (GOGC=200) unless the GOGC environment variable
// says otherwise. In catch-up medians this used 5-17 % less CPU per event
// than Go's default of 100 (BENCHMARKS.md, "A lazier garbage collector").
func defaultGC(env string) {
	if env == "" {
		debug.SetGCPercent(200)
	}
}

// defaultMemoryLimit sets a soft limit on the Go runtime's memory unless the
// GOMEMLIMIT environment variable (env) is set, and returns the limit in
// force as text ("96MiB", or "off"). The limit is three times the heap the
// in-flight caps can pin: the records' bytes (kafka.max_buffered_bytes), or
// about 1 KiB of bookkeeping per record (kafka.max_buffered_records),
// whichever is more, and at least 64 MiB; 96 MiB with the defaults. Nearing
// it, the collector runs more often instead of growing the heap.
func defaultMemoryLimit(env string, k config.Kafka) string {
	if env == "" {
		pinned := max(int64(k.MaxBufferedBytes), int64(k.MaxBufferedRecords)<<10)
		limit := int64(math.MaxInt64)
		if pinned < math.MaxInt64/3 {
			limit = max(3*pinned, minMemoryLimit)
		}
		debug.SetMemoryLimit(limit)
	}
	limit := debug.SetMemoryLimit(-1)
	if limit == math.MaxInt64 {
		return "off"
	}
	return strconv.FormatInt(limit>>20, 10) + "MiB"
}

// gcPercent returns the garbage collector's GOGC setting: a percentage, or
// "off".
func gcPercent() string {
	s := []runtimemetrics.Sample{{Name: "/gc/gogc:percent"}}
	runtimemetrics.Read(s)
	if v := s[0].Value.Uint64(); v <= math.MaxInt32 {
		return strconv.FormatUint(v, 10)
	}
	return "off"
}
