package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// The targets of the benchmark issue, judged from one run's results as
// ratios between contenders measured in that run: on a shared machine the
// absolute figures drift from hour to hour, the ratios much less. Every
// figure is the median of a contender's repeats of a workload
// (OUTBOXD_BENCH_CATCHUP_REPEAT, OUTBOXD_BENCH_LIVE_REPEAT).

// Thresholds, as the issue states them.
const (
	decodeShare    = 0.95 // catch-up ≥ this × Postgres' decoding rate (pg_recvlogical)
	debeziumFactor = 3.0  // catch-up ≥ this × Debezium tuned
	costShare      = 0.1  // CPU per event and peak RSS ≤ this × Debezium tuned's
	p50AboveFloor  = 1.0  // live p50 ≤ the floor's p50 + this many ms
	p99Share       = 1.0 / 20
	startupShare   = 1.0 / 20
	eosShare       = 0.9  // exactly_once catch-up ≥ this × at_least_once (issue 36 §2)
	eosP50Above    = 5.0  // exactly_once live p50 ≤ at_least_once's + this many ms (issue 36 §2)
	eosP99Factor   = 2.0  // exactly_once live p99 ≤ this × at_least_once's (issue 36 §2)
	liveRate       = 5000 // events/s of the live targets
)

// eosRates are the live rates the exactly-once latency targets hold at.
var eosRates = []float64{1000, 5000}

// The workloads the targets are judged on.
const (
	catchup100 = "catchup-100tx"
	catchup1   = "catchup-1tx"
	live250    = "live-250B"
)

// verdict is one target judged on one case (a workload or a live rate).
type verdict struct {
	target string  // what is judged and the threshold: "catch-up ≥ 3× Debezium tuned"
	on     string  // the case: "100-row tx"
	value  float64 // the ratio (or, for the p50 target, the ms above the floor)
	shown  string  // value as printed: "4.92×", "1/19", "+0.6 ms"
	pass   bool
	judged bool   // false when a contender it needs did not run
	info   bool   // figures with no threshold: neither PASS nor FAIL
	figure string // the absolute figures beside it
}

// with returns v with more added to its figures.
func (v verdict) with(more string) verdict {
	v.figure += more
	return v
}

func (v verdict) outcome() string {
	switch {
	case v.info:
		return "INFO"
	case !v.judged:
		return "NOT RUN"
	case v.pass:
		return "PASS"
	}
	return "FAIL"
}

type metric func(result) float64

func throughput(r result) float64 { return r.Throughput }
func cpu(r result) float64        { return r.CPUPer100k }
func peakRSS(r result) float64    { return r.PeakRSSMB }
func steadyRSS(r result) float64  { return r.SteadyRSSMB }
func startupSec(r result) float64 { return r.StartupSec }
func p50(r result) float64        { return r.P50ms }
func p99(r result) float64        { return r.P99ms }

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

// median returns the median of a contender's runs and whether it ran.
func (t runs) median(mode, workload, label string, rate float64, m metric) (float64, bool) {
	vs := t.values(mode, workload, label, rate, m)
	return median(vs), len(vs) > 0
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

// times formats a ratio ≥ 1 as "4.92×" and one below 1 as "1/19".
func times(r float64) string {
	switch {
	case r == 0 || math.IsInf(r, 0) || math.IsNaN(r):
		return "–"
	case r >= 1:
		return fmt.Sprintf("%.2f×", r)
	case r >= 0.5:
		return fmt.Sprintf("%.2f×", r)
	}
	return fmt.Sprintf("1/%.0f", 1/r)
}

// rateName names a live rate: 1k, 5k, 20k, or max for the writers' maximum.
func rateName(rate float64) string {
	switch {
	case rate == 0:
		return "max"
	case rate >= 1000 && math.Mod(rate, 1000) == 0:
		return fmt.Sprintf("%.0fk", rate/1000)
	}
	return fmt.Sprintf("%.0f", rate)
}

func kilo(v float64) string {
	if v >= 10000 {
		return fmt.Sprintf("%.1fk", v/1000)
	}
	return fmt.Sprintf("%.0f", v)
}

// mb formats megabytes, as GB from 1,000 MB.
func mb(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.1f GB", v/1000)
	}
	return fmt.Sprintf("%.0f MB", v)
}

func ms(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v < 1:
		return fmt.Sprintf("%.2f ms", v)
	}
	return fmt.Sprintf("%.1f ms", v)
}

func sec(v float64) string {
	if v < 1 {
		return fmt.Sprintf("%.0f ms", v*1000)
	}
	return fmt.Sprintf("%.1f s", v)
}

var caseName = map[string]string{
	catchup100:           "100-row tx",
	catchup1:             "one 1M-row tx",
	"catchup-100tx-4KB":  "100-row tx, 4 KB",
	"catchup-100tx-64KB": "100-row tx, 64 KB",
}

// judge returns the verdict on every target of the issue, in its order.
func judge(rs []result) []verdict {
	t := runsOf(rs)
	var vs []verdict
	vs = append(vs,
		t.atLeast("catch-up ≥ 0.95× Postgres' decoding rate (pg_recvlogical)", catchup100, "pg_recvlogical", throughput, decodeShare, kilo, " ev/s"),
		t.atLeast("catch-up ≥ 3× Debezium tuned", catchup100, "debezium_tuned", throughput, debeziumFactor, kilo, " ev/s"),
	)
	for _, w := range []string{catchup100, catchup1} {
		vs = append(vs, t.atMost("catch-up CPU per event ≤ 1/10 of Debezium tuned's", "catchup", w, 0, "debezium_tuned", cpu, costShare,
			func(v float64) string { return fmt.Sprintf("%.2f", v) }, " CPU-s per 100k"))
	}
	for _, w := range []string{catchup100, catchup1} {
		vs = append(vs, t.atMost("catch-up peak RSS ≤ 1/10 of Debezium tuned's", "catchup", w, 0, "debezium_tuned", peakRSS, costShare, mb, ""))
	}
	vs = append(vs,
		t.atMost("live peak RSS ≤ 1/10 of Debezium tuned's", "live", live250, liveRate, "debezium_tuned", peakRSS, costShare, mb, ""),
		t.p50OverFloor(),
		t.atMost("live p99 ≤ 1/20 of Debezium tuned's", "live", live250, liveRate, "debezium_tuned", p99, p99Share, ms, "").
			with(t.besideFigure("outboxd", liveRate, besideP99, "p99")),
		t.startup(),
		t.exactlyOnce(),
		t.eosLive("outboxd_eos live p50 ≤ outboxd's + 5 ms (read_committed)", p50, besideP50, func(e, a float64) float64 { return e - a }, eosP50Above,
			func(d float64) string { return fmt.Sprintf("%+.1f ms", d) }),
		t.eosLive("outboxd_eos live p99 ≤ 2× outboxd's (read_committed)", p99, besideP99, func(e, a float64) float64 { return e / a }, eosP99Factor,
			func(r float64) string { return fmt.Sprintf("%.2f×", r) }),
		t.shardsTarget(),
	)
	u := unavailable(rs)
	vs = append(vs,
		t.vsPeers("catch-up ≥ 2× the best peer", "catchup", catchup100, 0, throughput, true, peerFactor, kilo, " ev/s", u),
		t.vsPeers("catch-up CPU per event ≤ 1/2 of the best peer's", "catchup", catchup100, 0, cpu, false, peerShare,
			func(v float64) string { return fmt.Sprintf("%.2f", v) }, " CPU-s per 100k", u),
		t.vsPeers("live p99 ≤ 1/2 of the best peer's", "live", live250, liveRate, p99, false, peerShare, ms, "", u).
			with(t.besideFigure("outboxd", liveRate, besideP99, "p99")),
		delivery(rs),
	)
	for _, w := range []string{catchup100, catchup1} {
		if v, ok := t.shardedOutboxd(w); ok {
			vs = append(vs, v)
		}
	}
	return vs
}

// shardedOutboxd compares outboxd end to end with postgres.shards 2 and 4
// (the contenders outboxd_s2 and outboxd_s4) with one shard (outboxd) in the
// same run, on catch-up workload w: throughput, CPU per event and peak RSS
// as ratios to one shard. The issue sets no threshold for them (it asks
// what end to end reaches on this machine, where the walsenders, the broker
// and outboxd share two cores), so the line is informational. ok is false
// when no sharded contender ran w.
func (t runs) shardedOutboxd(w string) (verdict, bool) {
	v := verdict{target: "outboxd with 2 shards / 4 shards vs 1", on: caseName[w], info: true}
	sharded := []string{"outboxd_s2", "outboxd_s4"}
	ran := false
	for _, c := range sharded {
		_, ok := t.median("catchup", w, c, 0, throughput)
		ran = ran || ok
	}
	if !ran {
		return v, false
	}
	one, ok := t.median("catchup", w, "outboxd", 0, throughput)
	if !ok || one == 0 {
		v.shown, v.figure = "–", "no run of outboxd"
		return v, true
	}
	v.judged = true
	// each formats the sharded contenders' medians of m, and their ratios
	// to one shard's: "101.8k / 65.5k against 80.8k (1.26× / 0.81×)".
	each := func(m metric, f func(float64) string) (figures, ratios string) {
		base, _ := t.median("catchup", w, "outboxd", 0, m)
		var fs, rs []string
		for _, c := range sharded {
			x, ok := t.median("catchup", w, c, 0, m)
			if !ok {
				fs, rs = append(fs, "–"), append(rs, "–")
				continue
			}
			fs = append(fs, f(x))
			if base > 0 {
				rs = append(rs, fmt.Sprintf("%.2f×", x/base)) // not times' 1/N: these ratios are read side by side
			} else {
				rs = append(rs, "–")
			}
		}
		return strings.Join(fs, " / ") + " against " + f(base), strings.Join(rs, " / ")
	}
	tp, tpr := each(throughput, kilo)
	cp, cpr := each(cpu, func(v float64) string { return fmt.Sprintf("%.2f", v) })
	rss, rssr := each(peakRSS, mb)
	v.shown = tpr
	v.figure = fmt.Sprintf("%s ev/s; CPU-s per 100k %s (%s); peak RSS %s (%s)", tp, cp, cpr, rss, rssr)
	return v, true
}

// exactlyOnce judges outboxd's catch-up with kafka.delivery: exactly_once
// (the contender outboxd_eos, until its events are visible to a
// read_committed consumer) against the default at_least_once in the same
// run.
func (t runs) exactlyOnce() verdict {
	v := verdict{target: "exactly-once catch-up ≥ 0.9× at-least-once (read_committed)", on: caseName[catchup100]}
	e, ok1 := t.median("catchup", catchup100, "outboxd_eos", 0, throughput)
	a, ok2 := t.median("catchup", catchup100, "outboxd", 0, throughput)
	if !ok1 || !ok2 || a == 0 {
		v.figure = missing(ok2, ok1, "outboxd_eos")
		return v
	}
	v.value, v.judged = e/a, true
	v.shown, v.pass = times(v.value), v.value >= eosShare
	v.figure = fmt.Sprintf("outboxd_eos %s ev/s, outboxd %s ev/s", kilo(e), kilo(a))
	if e1, ok := t.median("catchup", catchup1, "outboxd_eos", 0, throughput); ok {
		if a1, ok := t.median("catchup", catchup1, "outboxd", 0, throughput); ok && a1 > 0 {
			v.figure += fmt.Sprintf(" (%s: %s, %s ev/s against %s)", caseName[catchup1], times(e1/a1), kilo(e1), kilo(a1))
		}
	}
	return v
}

// eosLive judges outboxd_eos's live latency m (as a read_committed consumer
// sees it) against outboxd's at every rate of eosRates: by(eos, outboxd) ≤
// limit at each. The value is the worst rate's; the target is not run
// unless both contenders ran at every rate. bm is m of the transactional
// producer beside outboxd_eos, shown where it ran.
func (t runs) eosLive(target string, m, bm metric, by func(e, a float64) float64, limit float64, f func(float64) string) verdict {
	var on []string
	for _, r := range eosRates {
		on = append(on, rateName(r))
	}
	v := verdict{target: target, on: strings.Join(on, " and ") + " ev/s"}
	var shown, figures, no []string
	worst := math.Inf(-1)
	for _, r := range eosRates {
		e, ok1 := t.median("live", live250, "outboxd_eos", r, m)
		a, ok2 := t.median("live", live250, "outboxd", r, m)
		if !ok1 {
			no = append(no, "outboxd_eos at "+rateName(r))
		}
		if !ok2 {
			no = append(no, "outboxd at "+rateName(r))
		}
		if !ok1 || !ok2 || a <= 0 {
			continue
		}
		x := by(e, a)
		worst = max(worst, x)
		shown = append(shown, f(x))
		fig := fmt.Sprintf("%s: outboxd_eos %s, outboxd %s", rateName(r), ms(e), ms(a))
		if k, ok := t.median("live", live250, "kafka_raw_eos", r, m); ok {
			// Kafka's own floor for a transaction's commit: what no
			// exactly-once relay on this broker can beat.
			fig += fmt.Sprintf(", kafka_raw_eos (Kafka's transaction floor) %s", ms(k))
		}
		if b, ok := t.beside("outboxd_eos", r, bm); ok {
			fig += fmt.Sprintf(", the same floor beside outboxd_eos %s", ms(b))
		}
		figures = append(figures, fig)
	}
	if len(no) > 0 {
		v.figure = "no run of " + strings.Join(no, " or ")
		return v
	}
	if len(shown) < len(eosRates) {
		v.figure = "no latency of outboxd to compare with"
		return v
	}
	v.value, v.judged = worst, true
	v.shown, v.pass = strings.Join(shown, " / "), worst <= limit
	v.figure = strings.Join(figures, "; ")
	return v
}

// atLeast judges outboxd's median catch-up m ≥ want × the other's.
func (t runs) atLeast(target, w, other string, m metric, want float64, f func(float64) string, unit string) verdict {
	v := verdict{target: target, on: caseName[w]}
	o, ok1 := t.median("catchup", w, "outboxd", 0, m)
	b, ok2 := t.median("catchup", w, other, 0, m)
	v.figure = fmt.Sprintf("outboxd %s%s, %s %s%s", f(o), unit, other, f(b), unit)
	if !ok1 || !ok2 || b == 0 {
		v.figure = missing(ok1, ok2, other)
		return v
	}
	v.value, v.judged = o/b, true
	v.shown, v.pass = times(v.value), v.value >= want
	if other == "pg_recvlogical" {
		if wr, ok := t.median("catchup", w, "pg_walread", 0, m); ok {
			v.figure += fmt.Sprintf(" (pg_walread, the same decoding read per 32 KB: %s%s, %s)", f(wr), unit, times(o/wr))
		}
	}
	return v
}

// atMost judges outboxd's median m ≤ want × the other's.
func (t runs) atMost(target, mode, w string, rate float64, other string, m metric, want float64, f func(float64) string, unit string) verdict {
	on := caseName[w]
	if mode == "live" {
		on = rateName(rate) + " ev/s"
	}
	v := verdict{target: target, on: on}
	o, ok1 := t.median(mode, w, "outboxd", rate, m)
	b, ok2 := t.median(mode, w, other, rate, m)
	if !ok1 || !ok2 || b == 0 {
		v.figure = missing(ok1, ok2, other)
		return v
	}
	v.value, v.judged = o/b, true
	v.shown, v.pass = times(v.value), v.value <= want
	v.figure = fmt.Sprintf("outboxd %s%s, %s %s%s", f(o), unit, other, f(b), unit)
	return v
}

// p50OverFloor judges the live p50 at 5k against the floor measured in the
// same run: the bare slot reader's p50 (Postgres' half) plus the raw
// producer's (Kafka's half). The p99 above the same floor is reported.
func (t runs) p50OverFloor() verdict {
	v := verdict{target: "live p50 ≤ the floor + 1 ms (bare slot reader + raw producer)", on: rateName(liveRate) + " ev/s"}
	o, ok1 := t.median("live", live250, "outboxd", liveRate, p50)
	pg, ok2 := t.median("live", live250, "pg_walread", liveRate, p50)
	k, ok3 := t.median("live", live250, "kafka_raw", liveRate, p50)
	if !ok1 || !ok2 || !ok3 {
		v.figure = missing(ok1, ok2 && ok3, "pg_walread and kafka_raw")
		return v
	}
	floor := pg + k
	v.value, v.judged = o-floor, true
	v.shown, v.pass = fmt.Sprintf("%+.1f ms", v.value), v.value <= p50AboveFloor
	v.figure = fmt.Sprintf("outboxd p50 %s, floor %s (pg_walread %s + kafka_raw %s)", ms(o), ms(floor), ms(pg), ms(k))
	o99, _ := t.median("live", live250, "outboxd", liveRate, p99)
	pg99, _ := t.median("live", live250, "pg_walread", liveRate, p99)
	k99, _ := t.median("live", live250, "kafka_raw", liveRate, p99)
	v.figure += fmt.Sprintf("; p99 %s, %s above its floor of %s", ms(o99), ms(o99-pg99-k99), ms(pg99+k99))
	if b50, ok := t.beside("outboxd", liveRate, besideP50); ok {
		b99, _ := t.beside("outboxd", liveRate, besideP99)
		v.figure += fmt.Sprintf("; a bare producer beside outboxd: p50 %s, p99 %s", ms(b50), ms(b99))
	}
	return v
}

// startup judges outboxd's start-up (process start to the first event in
// Kafka, 100-row catch-up) against the faster Debezium flavour's.
func (t runs) startup() verdict {
	v := verdict{target: "start-up to the first event in Kafka ≤ 1/20 of Debezium's", on: caseName[catchup100]}
	o, ok1 := t.median("catchup", catchup100, "outboxd", 0, startupSec)
	b, name, ok2 := 0.0, "", false
	for _, c := range []string{"debezium_default", "debezium_tuned"} {
		if d, ok := t.median("catchup", catchup100, c, 0, startupSec); ok && d > 0 && (!ok2 || d < b) {
			b, name, ok2 = d, c, true
		}
	}
	if !ok1 || !ok2 {
		v.figure = missing(ok1, ok2, "debezium")
		return v
	}
	v.value, v.judged = o/b, true
	v.shown, v.pass = times(v.value), v.value <= startupShare
	v.figure = fmt.Sprintf("outboxd %s, %s %s", sec(o), name, sec(b))
	return v
}

func missing(outboxd, other bool, name string) string {
	var no []string
	if !outboxd {
		no = append(no, "outboxd")
	}
	if !other {
		no = append(no, name)
	}
	return "no run of " + strings.Join(no, " or ")
}

// printTargets writes one line per verdict, as make bench prints them.
func printTargets(w io.Writer, vs []verdict) {
	width := 0
	for _, v := range vs {
		width = max(width, len([]rune(v.target+", "+v.on)))
	}
	for _, v := range vs {
		name := v.target + ", " + v.on
		fmt.Fprintf(w, "%-7s %s%s  %-8s %s\n", v.outcome(), name, strings.Repeat(" ", width-len([]rune(name))), v.shown, v.figure)
	}
}

// writeTargets writes the verdicts as a Markdown table.
func writeTargets(md *strings.Builder, vs []verdict) {
	md.WriteString("| target | case | ratio | verdict | medians |\n|---|---|--:|---|---|\n")
	for _, v := range vs {
		fmt.Fprintf(md, "| %s | %s | %s | %s | %s |\n", v.target, v.on, v.shown, v.outcome(), v.figure)
	}
	md.WriteString("\n")
}
