package main

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The targets of the benchmark issue, judged from one run's results. Every
// figure is the median of a contender's repeats of a workload
// (OUTBOXD_BENCH_CATCHUP_REPEAT, OUTBOXD_BENCH_LIVE_REPEAT); each run's value
// is listed beside it, so a median that hides a spread is visible.

// verdict is one target's outcome over the cases (workloads, rates) it is
// judged on. A target whose contenders did not run has no cases.
type verdict struct {
	target string
	parts  []string // per case: the medians, and each run's value
	missed int      // cases that miss the target
}

func (v *verdict) add(ok bool, part string) {
	v.parts = append(v.parts, part)
	if !ok {
		v.missed++
	}
}

func (v *verdict) judged() bool { return len(v.parts) > 0 }
func (v *verdict) met() bool    { return v.judged() && v.missed == 0 }
func (v *verdict) figure() string {
	if !v.judged() {
		return "not run"
	}
	return strings.Join(v.parts, "; ")
}

// catchupWorkloads are judged against the physical limits; the 250 B ones
// also against Debezium, and for CPU, start-up and memory.
var (
	catchupWorkloads = []string{"catchup-100tx", "catchup-1tx", "catchup-100tx-4KB", "catchup-100tx-64KB"}
	catchup250       = []string{"catchup-100tx", "catchup-1tx"}
)

// Thresholds, as the issue states them.
const (
	debeziumFactor = 5.0   // × Debezium tuned
	limitShare     = 0.8   // of the lower physical limit
	p99At5k        = 10.0  // ms
	keepUpDrain    = 1.0   // s after the writers stop, at their maximum rate
	steadyRSS      = 64.0  // MB
	catchupRSS     = 128.0 // MB
	startup        = 0.2   // s
	cpuPer100k     = 0.5   // CPU-s per 100k events at 250 B
)

// judge returns the verdict on every target, in the order.
func judge(rs []result) []verdict {
	t := runsOf(rs)
	return []verdict{
		t.ratio("catch-up ≥ 5× Debezium tuned (250 B)", catchup250, debeziumFactor, func(w string) (float64, string) {
			return t.median("catchup", w, "debezium_tuned", 0, throughput), "debezium_tuned"
		}),
		t.ratio("catch-up ≥ 80 % of the lower physical limit", catchupWorkloads, limitShare, t.limit),
		t.live("live p99 ≤ 10 ms at 5k ev/s", 5000, p99At5k, p99, "%.1f ms"),
		t.keepsUp(),
		t.steadyRSS(),
		t.outboxd("RSS ≤ 128 MB during the 1M catch-up (250 B)", catchup250, catchupRSS, peakRSS, "%.0f MB"),
		t.outboxd("start-up ≤ 200 ms", []string{"catchup-100tx", "catchup-100tx-4KB", "catchup-100tx-64KB"}, startup, startupSec, "%.3f s"),
		t.outboxd("CPU ≤ 0.5 CPU-s per 100k events (250 B catch-up)", catchup250, cpuPer100k, cpu, "%.2f"),
	}
}

type metric func(result) float64

func throughput(r result) float64 { return r.Throughput }
func p99(r result) float64        { return r.P99ms }
func peakRSS(r result) float64    { return r.PeakRSSMB }
func steady(r result) float64     { return r.SteadyRSSMB }
func startupSec(r result) float64 { return r.StartupSec }
func cpu(r result) float64        { return r.CPUPer100k }

// runs groups results by mode, workload, contender and live target rate.
type runs map[string][]result

func runKey(mode, workload, label string, rate float64) string {
	return fmt.Sprintf("%s|%s|%s|%.0f", mode, workload, label, rate)
}

func runsOf(rs []result) runs {
	t := runs{}
	for _, r := range rs {
		k := runKey(r.Mode, r.Workload, r.Label, r.TargetRate)
		t[k] = append(t[k], r)
	}
	return t
}

func (t runs) values(mode, workload, label string, rate float64, m metric) []float64 {
	var vs []float64
	for _, r := range t[runKey(mode, workload, label, rate)] {
		vs = append(vs, m(r))
	}
	return vs
}

// median returns the median of the values, or 0 when there are none.
func (t runs) median(mode, workload, label string, rate float64, m metric) float64 {
	return median(t.values(mode, workload, label, rate, m))
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// each lists the values: "(3 runs: 1, 2, 3)".
func each(vs []float64, format string) string {
	if len(vs) < 2 {
		return ""
	}
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf(format, v)
	}
	return fmt.Sprintf(" (%d runs: %s)", len(vs), strings.Join(parts, ", "))
}

// limit returns the lower physical limit of a workload and its source:
// Postgres' decoding rate, the faster of its two readers (each is a lower
// bound of what Postgres can decode), against Kafka's raw produce rate.
func (t runs) limit(w string) (float64, string) {
	pg, pgName := 0.0, ""
	for _, c := range []string{"pg_recvlogical", "pg_walread"} {
		if v := t.median("catchup", w, c, 0, throughput); v > pg {
			pg, pgName = v, c
		}
	}
	k := t.median("catchup", w, "kafka_raw", 0, throughput)
	switch {
	case pg == 0 || (k > 0 && k < pg):
		return k, "kafka_raw"
	default:
		return pg, pgName
	}
}

// ratio judges outboxd's median throughput against base(w) ≥ want for
// every workload of ws that ran.
func (t runs) ratio(target string, ws []string, want float64, base func(string) (float64, string)) verdict {
	v := verdict{target: target}
	for _, w := range ws {
		o := t.values("catchup", w, "outboxd", 0, throughput)
		b, name := base(w)
		if len(o) == 0 || b == 0 {
			continue
		}
		r := median(o) / b
		v.add(r >= want, fmt.Sprintf("%s: %s vs %s %s = %s%s", w, kilo(median(o)), name, kilo(b), share(r, want), each(o, "%.0f")))
	}
	return v
}

func share(r, want float64) string {
	if want < 1 {
		return fmt.Sprintf("%.0f %%", 100*r)
	}
	return fmt.Sprintf("%.2f×", r)
}

func kilo(v float64) string {
	if v >= 10000 {
		return fmt.Sprintf("%.1fk", v/1000)
	}
	return fmt.Sprintf("%.0f", v)
}

// live judges outboxd's median m at a live rate ≤ want.
func (t runs) live(target string, rate, want float64, m metric, format string) verdict {
	v := verdict{target: target}
	if vs := t.values("live", "live-250B", "outboxd", rate, m); len(vs) > 0 {
		md := median(vs)
		v.add(md <= want, "median "+fmt.Sprintf(format, md)+each(vs, format))
	}
	return v
}

var (
	drainedRE = regexp.MustCompile(`drained ([0-9.]+)s after`)
	missingRE = regexp.MustCompile(`(\d+) events never seen`)
)

// drain reads a live run's drain time and missing events, from the note of
// results written before they had fields of their own.
func drain(r result) (sec float64, missing int) {
	if r.DrainSec != nil {
		return *r.DrainSec, r.Missing
	}
	if m := drainedRE.FindStringSubmatch(r.Note); m != nil {
		sec, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := missingRE.FindStringSubmatch(r.Note); m != nil {
		missing, _ = strconv.Atoi(m[1])
	}
	return sec, missing
}

// keepsUp judges the unpaced live runs: every event arrived, and the median
// run drained within keepUpDrain of the writers stopping.
func (t runs) keepsUp() verdict {
	v := verdict{target: "keeps up with the writers' maximum rate"}
	rs := t[runKey("live", "live-250B", "outboxd", 0)]
	if len(rs) == 0 {
		return v
	}
	var secs, rates []float64
	lost := 0
	for _, r := range rs {
		s, m := drain(r)
		secs, rates, lost = append(secs, s), append(rates, r.WriteRate), lost+m
	}
	md := median(secs)
	fig := fmt.Sprintf("writers at %s ev/s (median); last event in Kafka a median %.2f s after they stopped%s", kilo(median(rates)), md, each(secs, "%.2f s"))
	if lost > 0 {
		fig += fmt.Sprintf("; %d events never seen", lost)
	}
	v.add(lost == 0 && md <= keepUpDrain, fig)
	return v
}

// steadyRSS judges the highest median steady RSS over the live rates.
func (t runs) steadyRSS() verdict {
	v := verdict{target: "steady RSS ≤ 64 MB (live)"}
	for _, rate := range []float64{1000, 5000, 20000, 0} {
		vs := t.values("live", "live-250B", "outboxd", rate, steady)
		if len(vs) == 0 {
			continue
		}
		md := median(vs)
		name := "max"
		if rate > 0 {
			name = fmt.Sprintf("%.0f", rate)
		}
		v.add(md <= steadyRSS, fmt.Sprintf("%s ev/s: %.0f MB%s", name, md, each(vs, "%.0f")))
	}
	return v
}

// outboxd judges outboxd's median m ≤ want in every workload of ws that ran.
func (t runs) outboxd(target string, ws []string, want float64, m metric, format string) verdict {
	v := verdict{target: target}
	for _, w := range ws {
		vs := t.values("catchup", w, "outboxd", 0, m)
		if len(vs) == 0 {
			continue
		}
		md := median(vs)
		v.add(md <= want, w+": "+fmt.Sprintf(format, md)+each(vs, format))
	}
	return v
}

// writeTargets writes the verdicts as a Markdown table.
func writeTargets(md *strings.Builder, vs []verdict) {
	md.WriteString("### Against the targets (medians over each contender's repeats in this run)\n\n")
	md.WriteString("| target | figure | verdict |\n|---|---|---|\n")
	for _, v := range vs {
		verdict := "not judged"
		switch {
		case v.met():
			verdict = "met"
		case v.judged():
			verdict = "**not met**"
		}
		fmt.Fprintf(md, "| %s | %s | %s |\n", v.target, v.figure(), verdict)
	}
	md.WriteString("\n")
}
