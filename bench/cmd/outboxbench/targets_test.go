package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

func catchupRun(label, workload string, throughput, cpu, rss, start float64) result {
	return result{Mode: "catchup", Label: label, Workload: workload, Throughput: throughput,
		CPUPer100k: cpu, PeakRSSMB: rss, StartupSec: start, Verified: true}
}

func liveRun(label string, rate, p50, p99, rss float64) result {
	return result{Mode: "live", Label: label, Workload: live250, TargetRate: rate, P50ms: p50, P99ms: p99, PeakRSSMB: rss, Verified: true}
}

// passing is a run in which every target holds on the medians, although
// one repeat of outboxd's misses each.
func passing() []result {
	var rs []result
	for _, w := range []string{catchup100, catchup1} {
		rs = append(rs,
			catchupRun("outboxd", w, 150000, 0.45, 60, 0.08),
			catchupRun("outboxd", w, 90000, 0.90, 300, 0.50), // a bad repeat
			catchupRun("outboxd", w, 160000, 0.40, 58, 0.07),
			catchupRun("debezium_default", w, 30000, 5, 1300, 8),
			catchupRun("debezium_tuned", w, 40000, 5, 1200, 9),
			catchupRun("pg_recvlogical", w, 150000, 0.4, 10, 0),
			catchupRun("pg_walread", w, 170000, 0.2, 10, 0),
			catchupRun("outboxd_eos", w, 145000, 0.5, 70, 0.1),
			catchupRun("go_pq_cdc_kafka", w, 50000, 1.2, 100, 0.5),
		)
	}
	return append(rs,
		liveRun("outboxd", liveRate, 1.2, 8, 28), liveRun("outboxd", liveRate, 1.5, 300, 28), liveRun("outboxd", liveRate, 1.1, 9, 28),
		liveRun("pg_walread", liveRate, 0.1, 0.8, 17), liveRun("kafka_raw", liveRate, 0.3, 1.5, 0),
		liveRun("debezium_tuned", liveRate, 15, 2000, 1200),
		liveRun("outboxd_eos", liveRate, 4.2, 14, 30),
		liveRun("outboxd", 1000, 1.0, 2.5, 26), liveRun("outboxd_eos", 1000, 3.0, 2.4, 27),
		liveRun("go_pq_cdc_kafka", liveRate, 100, 250, 40),
		result{Mode: "unavailable", Label: "conduit", Note: "not served"},
		shardsRun(shards1, 163000), shardsRun(shards2, 269000), shardsRun(shards4, 280000),
	)
}

func shardsRun(workload string, throughput float64) result {
	return result{Mode: "shards", Label: "pg_walread", Workload: workload, Throughput: throughput}
}

// repeat returns n copies of r: enough repeats to move a median.
func repeat(n int, r result) []result {
	rs := make([]result, n)
	for i := range rs {
		rs[i] = r
	}
	return rs
}

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		name   string
		extra  []result // runs added to passing()
		failed string   // what the failing verdicts' target and case contain; "" for none
	}{
		{"medians hold", nil, ""},
		{"under 0.95x pg_recvlogical", repeat(4, catchupRun("pg_recvlogical", catchup100, 170000, 0.4, 10, 0)), "decoding rate"},
		{"under 3x Debezium tuned", repeat(4, catchupRun("debezium_tuned", catchup100, 55000, 5, 1200, 9)), "3× Debezium"},
		{"CPU over a tenth, one transaction", repeat(4, catchupRun("outboxd", catchup1, 150000, 0.6, 60, 0.08)), "CPU per event ≤ 1/10 of Debezium tuned's, one 1M-row tx"},
		{"catch-up RSS over a tenth", repeat(4, catchupRun("outboxd", catchup100, 150000, 0.45, 130, 0.08)), "catch-up peak RSS ≤ 1/10 of Debezium tuned's, 100-row tx"},
		{"live RSS over a tenth", repeat(4, liveRun("outboxd", liveRate, 1.2, 8, 130)), "live peak RSS"},
		{"p50 more than 1 ms above the floor", repeat(4, liveRun("outboxd", liveRate, 1.5, 8, 28)), "p50 ≤ the floor"},
		{"p99 over a twentieth", repeat(4, liveRun("outboxd", liveRate, 1.2, 101, 28)), "p99 ≤ 1/20"},
		{"start-up over a twentieth of the faster Debezium", repeat(4, catchupRun("outboxd", catchup100, 150000, 0.45, 60, 0.45)), "start-up"},
		{"2 slots under 1.5x one", repeat(4, shardsRun(shards2, 200000)), "2 sharded slots"},
		{"exactly-once under 0.9x at-least-once", repeat(4, catchupRun("outboxd_eos", catchup100, 130000, 0.5, 70, 0.1)), "exactly-once"},
		{"exactly-once p50 more than 5 ms above at 1k", repeat(4, liveRun("outboxd_eos", 1000, 6.1, 4.0, 27)), "outboxd_eos live p50"},
		{"exactly-once p50 more than 5 ms above at 5k", repeat(4, liveRun("outboxd_eos", liveRate, 55, 17, 30)), "outboxd_eos live p50"},
		{"exactly-once p99 over 2x at 1k", repeat(4, liveRun("outboxd_eos", 1000, 3.0, 5.1, 27)), "outboxd_eos live p99"},
		{"exactly-once p99 over 2x at 5k", repeat(4, liveRun("outboxd_eos", liveRate, 4.2, 19, 30)), "outboxd_eos live p99"},
		{"under 2x the best peer", repeat(4, catchupRun("go_pq_cdc_kafka", catchup100, 80000, 1.2, 100, 0.5)), "catch-up ≥ 2× the best peer"},
		{"CPU over half the best peer's", repeat(4, catchupRun("go_pq_cdc_kafka", catchup100, 50000, 0.8, 100, 0.5)), "CPU per event ≤ 1/2"},
		{"p99 over half the best peer's", repeat(4, liveRun("go_pq_cdc_kafka", liveRate, 10, 15, 40)), "p99 ≤ 1/2 "},
		{"outboxd lost an event", []result{{Mode: "live", Label: "outboxd", Workload: live250, TargetRate: 1000, Verified: true, Missing: 1}}, "every event delivered"},
		{"a peer's losses are counted, not judged", []result{{Mode: "catchup", Label: "go_pq_cdc_kafka", Workload: catchup1, Verified: true, Missing: 3, Repeated: 2}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failed := 0
			for _, v := range judge(append(passing(), tc.extra...)) {
				want := tc.failed == "" || !strings.Contains(v.target+", "+v.on, tc.failed)
				if !want {
					failed++
				}
				if !v.judged || v.pass != want {
					t.Errorf("%s, %s: judged %v, pass %v, want pass %v; %s %s", v.target, v.on, v.judged, v.pass, want, v.shown, v.figure)
				}
			}
			if tc.failed != "" && failed == 0 {
				t.Errorf("no target matches %q", tc.failed)
			}
		})
	}
}

func TestJudgeRatios(t *testing.T) {
	vs := judge(passing())
	want := map[string]float64{
		"catch-up ≥ 0.95× Postgres' decoding rate (pg_recvlogical), 100-row tx":    1.0,  // 150k / 150k
		"catch-up ≥ 3× Debezium tuned, 100-row tx":                                 3.75, // 150k / 40k
		"catch-up CPU per event ≤ 1/10 of Debezium tuned's, 100-row tx":            0.09, // 0.45 / 5
		"catch-up peak RSS ≤ 1/10 of Debezium tuned's, 100-row tx":                 0.05, // 60 / 1200
		"live peak RSS ≤ 1/10 of Debezium tuned's, 5k ev/s":                        28.0 / 1200,
		"live p50 ≤ the floor + 1 ms (bare slot reader + raw producer), 5k ev/s":   1.2 - 0.4, // ms above the floor
		"live p99 ≤ 1/20 of Debezium tuned's, 5k ev/s":                             9.0 / 2000,
		"start-up to the first event in Kafka ≤ 1/20 of Debezium's, 100-row tx":    0.08 / 8, // the faster Debezium
		"decoding with 2 sharded slots ≥ 1.5× one slot, 100-row tx":                269.0 / 163,
		"exactly-once catch-up ≥ 0.9× at-least-once (read_committed), 100-row tx":  145.0 / 150, // outboxd_eos / outboxd
		"outboxd_eos live p50 ≤ outboxd's + 5 ms (read_committed), 1k and 5k ev/s": 4.2 - 1.2,   // the worse rate: 5k (1k: +2.0)
		"outboxd_eos live p99 ≤ 2× outboxd's (read_committed), 1k and 5k ev/s":     14.0 / 9,    // the worse rate: 5k (1k: 2.4 / 2.5)
		"catch-up ≥ 2× the best peer, 100-row tx":                                  150.0 / 50,  // go_pq_cdc_kafka beats Debezium
		"catch-up CPU per event ≤ 1/2 of the best peer's, 100-row tx":              0.45 / 1.2,
		"live p99 ≤ 1/2 of the best peer's, 5k ev/s":                               9.0 / 250,
	}
	seen := 0
	for _, v := range vs {
		w, ok := want[v.target+", "+v.on]
		if !ok {
			continue
		}
		seen++
		if math.Abs(v.value-w) > 1e-9 {
			t.Errorf("%s, %s = %g, want %g", v.target, v.on, v.value, w)
		}
	}
	if seen != len(want) {
		t.Errorf("found %d of the %d targets", seen, len(want))
	}
}

func TestJudgeWithoutContenders(t *testing.T) {
	alone := catchupRun("outboxd", catchup100, 1, 1, 1, 1)
	alone.Verified = false // a result from before the delivery check
	for _, v := range judge([]result{alone}) {
		if v.judged || v.pass || v.outcome() != "NOT RUN" {
			t.Errorf("%s, %s: judged %v, pass %v without the contenders to compare with", v.target, v.on, v.judged, v.pass)
		}
		if !strings.HasPrefix(v.figure, "no run of") {
			t.Errorf("%s, %s: figure %q does not say what is missing", v.target, v.on, v.figure)
		}
	}
}

func TestPrintTargets(t *testing.T) {
	var b bytes.Buffer
	rs := append(passing(), repeat(4, liveRun("outboxd", liveRate, 1.2, 101, 28))...)
	printTargets(&b, judge(rs))
	out := b.String()
	if n := strings.Count(out, "\n"); n != len(judge(rs)) {
		t.Errorf("%d lines for %d targets:\n%s", n, len(judge(rs)), out)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasPrefix(line, "PASS ") && !strings.HasPrefix(line, "FAIL ") {
			t.Errorf("line without PASS or FAIL: %q", line)
		}
		if strings.Contains(line, "p99 ≤ 1/20") && !strings.HasPrefix(line, "FAIL") {
			t.Errorf("the p99 target should fail: %q", line)
		}
	}
}

func TestTimes(t *testing.T) {
	for _, tc := range []struct {
		r    float64
		want string
	}{
		{4.923, "4.92×"}, {0.95, "0.95×"}, {1.0 / 15, "1/15"}, {0.0072, "1/139"}, {0, "–"}, {math.Inf(1), "–"},
	} {
		if got := times(tc.r); got != tc.want {
			t.Errorf("times(%g) = %q, want %q", tc.r, got, tc.want)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		vs   []float64
		want float64
	}{
		{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(tc.vs); got != tc.want {
			t.Errorf("median(%v) = %g, want %g", tc.vs, got, tc.want)
		}
	}
}

func TestShardModel(t *testing.T) {
	// Issue 28's measurement: 3.07 s for the whole fill, 1.91 s for a half
	// shard and 1.33 s for a quarter, 500,000 events.
	var rs []result
	for _, a := range []struct {
		w   string
		sec float64
	}{{"shard-alone-1/1", 3.07}, {"shard-alone-1/2", 1.91}, {"shard-alone-1/4", 1.33}} {
		rs = append(rs, result{Mode: "shards", Label: "pg_walread", Workload: a.w, Events: 500000, TotalSec: a.sec})
	}
	m, ok := runsOf(rs).shardModel()
	if !ok {
		t.Fatal("no model from three shares")
	}
	if math.Abs(m.fixed-0.75) > 0.01 || math.Abs(m.output-2.32) > 0.01 {
		t.Errorf("fixed %.3f s, output %.3f s; want about 0.75 and 2.32", m.fixed, m.output)
	}
	// One slot on one core: the alone time of the whole fill.
	if got, want := m.rate(1, 1), 500000/(m.fixed+m.output); math.Abs(got-want) > 1 {
		t.Errorf("rate(1, 1) = %.0f, want %.0f", got, want)
	}
	// Four walsenders on two cores are bound by the cores: (4 × fixed + output) / 2.
	if got, want := m.rate(4, 2), 500000/((4*m.fixed+m.output)/2); math.Abs(got-want) > 1 {
		t.Errorf("rate(4, 2) = %.0f, want %.0f", got, want)
	}
}

func TestShardedOutboxd(t *testing.T) {
	for _, v := range judge(passing()) {
		if v.info {
			t.Errorf("a line %q without runs of outboxd_s2 or outboxd_s4", v.target)
		}
	}
	rs := append(passing(),
		catchupRun("outboxd_s2", catchup100, 180000, 0.6, 75, 0.1),
		catchupRun("outboxd_s4", catchup100, 120000, 0.9, 120, 0.1))
	var got []verdict
	for _, v := range judge(rs) {
		if v.info {
			got = append(got, v)
		}
	}
	if len(got) != 1 {
		t.Fatalf("%d informational lines, want 1 (100-row tx only): %+v", len(got), got)
	}
	v := got[0]
	// outboxd's medians: 150k ev/s, 0.45 CPU-s per 100k, 60 MB.
	if v.outcome() != "INFO" || v.on != caseName[catchup100] || v.shown != "1.20× / 0.80×" {
		t.Errorf("outcome %s, case %s, shown %q; want INFO, %s, 1.20× / 0.80×", v.outcome(), v.on, v.shown, caseName[catchup100])
	}
	for _, want := range []string{"180.0k / 120.0k against 150.0k ev/s", "0.60 / 0.90 against 0.45 (1.33× / 2.00×)", "75 MB / 120 MB against 60 MB (1.25× / 2.00×)"} {
		if !strings.Contains(v.figure, want) {
			t.Errorf("figure %q lacks %q", v.figure, want)
		}
	}
	var b bytes.Buffer
	printTargets(&b, judge(rs))
	if !strings.Contains(b.String(), "\nINFO    outboxd with 2 shards / 4 shards vs 1, 100-row tx") {
		t.Errorf("no INFO line in:\n%s", b.String())
	}
	// A run of outboxd_s4 alone: the missing contender shows as "–".
	v, ok := runsOf(append(passing(), catchupRun("outboxd_s4", catchup1, 120000, 0.9, 120, 0.1))).shardedOutboxd(catchup1)
	if !ok || v.shown != "– / 0.80×" {
		t.Errorf("outboxd_s4 alone: ok %v, shown %q; want – / 0.80×", ok, v.shown)
	}
}

// TestEOSFigureNamesKafkasFloor: with kafka_raw_eos in the run, the
// exactly-once latency targets cite Kafka's own transaction floor beside
// outboxd_eos, so a FAIL shows whether the broker leaves room to pass.
func TestEOSFigureNamesKafkasFloor(t *testing.T) {
	rs := append(passing(), liveRun("kafka_raw_eos", 1000, 9.5, 20, 0), liveRun("kafka_raw_eos", liveRate, 11, 30, 0))
	found := 0
	for _, v := range judge(rs) {
		if !strings.HasPrefix(v.target, "outboxd_eos live") {
			continue
		}
		found++
		if !strings.Contains(v.figure, "1k: outboxd_eos 3.0 ms, outboxd 1.0 ms, kafka_raw_eos (Kafka's transaction floor) 9.5 ms") &&
			!strings.Contains(v.figure, "kafka_raw_eos (Kafka's transaction floor) 20.0 ms") {
			t.Errorf("%s: figure %q does not cite kafka_raw_eos", v.target, v.figure)
		}
	}
	if found != 2 {
		t.Errorf("found %d exactly-once latency targets, want 2", found)
	}
}
