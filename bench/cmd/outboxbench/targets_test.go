package main

import (
	"strings"
	"testing"
)

func catchupRun(label, workload string, throughput, cpu, rss, start float64) result {
	return result{Mode: "catchup", Label: label, Workload: workload, Throughput: throughput,
		CPUPer100k: cpu, PeakRSSMB: rss, StartupSec: start}
}

func liveRun(rate, p99, steady float64, note string) result {
	return result{Mode: "live", Label: "outboxd", Workload: "live-250B", TargetRate: rate,
		P99ms: p99, SteadyRSSMB: steady, WriteRate: 20000, Note: note}
}

// passing is a run in which every target holds on the medians, although
// one repeat of each misses.
func passing() []result {
	var rs []result
	for _, w := range catchup250 {
		rs = append(rs,
			catchupRun("outboxd", w, 150000, 0.45, 60, 0.08),
			catchupRun("outboxd", w, 90000, 0.70, 140, 0.50), // a bad repeat
			catchupRun("outboxd", w, 160000, 0.40, 58, 0.07),
			catchupRun("debezium_tuned", w, 28000, 5, 1200, 9),
			catchupRun("pg_recvlogical", w, 150000, 0.4, 10, 0),
			catchupRun("pg_walread", w, 170000, 0.2, 10, 0),
			catchupRun("kafka_raw", w, 400000, 0.2, 0, 0.2),
		)
	}
	drained := "16 writers, 500 events measured after 3s warm-up, drained 0.00s after writers stopped"
	return append(rs,
		liveRun(5000, 8, 23, ""), liveRun(5000, 30, 23, ""), liveRun(5000, 9, 23, ""),
		liveRun(0, 0, 33, drained), liveRun(0, 0, 33, strings.Replace(drained, "0.00s", "2.50s", 1)), liveRun(0, 0, 33, drained),
	)
}

// times returns n copies of r: enough repeats to move a median.
func times(n int, r result) []result {
	rs := make([]result, n)
	for i := range rs {
		rs[i] = r
	}
	return rs
}

func TestJudge(t *testing.T) {
	slowDrain := liveRun(0, 0, 33, "")
	d := 4.0
	slowDrain.DrainSec = &d
	for _, tc := range []struct {
		name   string
		extra  []result // runs added to passing()
		failed string   // the one target that fails; "" for none
	}{
		{"medians hold", nil, ""},
		{"slower than 5x Debezium", times(2, catchupRun("debezium_tuned", "catchup-1tx", 40000, 5, 1200, 9)), "Debezium"},
		{"the faster Postgres reader is the limit", times(2, catchupRun("pg_walread", "catchup-100tx", 200000, 0.2, 10, 0)), "physical limit"},
		{"p99 over 10 ms", []result{liveRun(5000, 12, 23, ""), liveRun(5000, 15, 23, "")}, "p99"},
		{"events lost at the maximum rate", []result{liveRun(0, 0, 33, "drained 0.00s after writers stopped; 3 events never seen")}, "keeps up"},
		{"slow drain at the maximum rate", times(2, slowDrain), "keeps up"},
		{"steady RSS", times(4, liveRun(5000, 8, 80, "")), "steady RSS"},
		{"catch-up RSS", times(2, catchupRun("outboxd", "catchup-1tx", 150000, 0.45, 200, 0.08)), "128 MB"},
		{"CPU", times(2, catchupRun("outboxd", "catchup-100tx", 150000, 0.6, 60, 0.08)), "CPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, v := range judge(append(passing(), tc.extra...)) {
				want := tc.failed == "" || !strings.Contains(v.target, tc.failed)
				if !v.judged() || v.met() != want {
					t.Errorf("%s: judged %v, met %v, want met %v; figure %s", v.target, v.judged(), v.met(), want, v.figure())
				}
			}
		})
	}
}

func TestJudgeWithoutContenders(t *testing.T) {
	for _, v := range judge([]result{catchupRun("outboxd", "catchup-100tx", 1, 1, 1, 1)}) {
		if strings.Contains(v.target, "Debezium") || strings.Contains(v.target, "limit") || strings.Contains(v.target, "live") {
			if v.judged() || v.met() {
				t.Errorf("%s: judged %v, met %v without the contenders to compare with", v.target, v.judged(), v.met())
			}
		}
	}
}

func TestLimit(t *testing.T) {
	rs := passing()
	if v, name := runsOf(rs).limit("catchup-100tx"); v != 170000 || name != "pg_walread" {
		t.Errorf("limit = %.0f from %s, want 170000 from pg_walread, the faster Postgres reader", v, name)
	}
	rs = append(rs, catchupRun("kafka_raw", "catchup-100tx", 120000, 0.2, 0, 0.2), catchupRun("kafka_raw", "catchup-100tx", 120000, 0.2, 0, 0.2))
	if v, name := runsOf(rs).limit("catchup-100tx"); v != 120000 || name != "kafka_raw" {
		t.Errorf("limit = %.0f from %s, want 120000 from kafka_raw, the lower limit", v, name)
	}
}
