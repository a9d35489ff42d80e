package main

import (
	"strings"
	"testing"
)

func TestTakeoverCmd(t *testing.T) {
	p := plan{dsn: "postgres://x", brokers: "127.0.0.1:1", outboxd: "/bin/a", httpListen: "127.0.0.1:9"}
	for _, tc := range []struct {
		c         string
		want, not []string
	}{
		{"outboxd", []string{"OUTBOXD_POSTGRES_PUBLICATION=bench", "OUTBOXD_HTTP_LISTEN=127.0.0.1:9"}, []string{"OUTBOXD_POSTGRES_BACKFILL_WHERE=true"}},
		{"outboxd_backfill", []string{"OUTBOXD_POSTGRES_BACKFILL_WHERE=true", "OUTBOXD_POSTGRES_CREATE_SLOT=true", "OUTBOXD_POSTGRES_PUBLICATION=bench"}, nil},
		{"outboxd_alltables", []string{"OUTBOXD_POSTGRES_PUBLICATION=" + allTablesPub}, []string{"OUTBOXD_POSTGRES_PUBLICATION=bench"}},
	} {
		checkWords(t, tc.c, p.outboxdCmd(tc.c, "s"), tc.want, tc.not)
	}
	if publicationOf("pg_recvlogical_alltables") != allTablesPub || publicationOf("pg_recvlogical") != "bench" {
		t.Error("pg_recvlogical reads the wrong publication")
	}
}

// TestTakeoverReport: each takeover section gets its table and its ratios
// in report.md, and none when it did not run; no PASS or FAIL.
func TestTakeoverReport(t *testing.T) {
	cu := func(w, c string, tp float64) result {
		r := catchupRun(c, w, tp, 1, 50, 0.1)
		r.Events, r.WallRate = 1000, tp/2
		return r
	}
	lv := func(w string, p99 float64) result {
		r := liveRun("outboxd", replayLiveRate, 2, p99, 30)
		r.Workload = w
		return r
	}
	rs := []result{
		cu(backfillWorkload, "pg_copy", 100000), cu(backfillWorkload, "outboxd_backfill", 25000), cu(backfillWorkload, "outboxd", 50000),
		cu(multitableAlone, "outboxd", 80000), cu(multitableBusy, "outboxd", 60000), cu(multitableBusy, "outboxd_alltables", 30000),
		lv(replayLiveAlone, 4), lv(replayLiveBeside, 8), cu(replayWorkload, "outboxd_replay", 990),
	}
	got := map[string]string{}
	for _, r := range runsOf(rs).takeoverRatios() {
		got[r.name] = times(r.value)
	}
	for name, want := range map[string]string{
		"backfill ÷ COPY of the same rows (rows/s, first → last record)":                 "1/4",
		"backfill ÷ COPY of the same rows (rows/s, outboxd's start → last record)":       "1/8",
		"backfill ÷ outboxd's catch-up of the same rows from a slot":                     "0.50×",
		"outboxd beside a busy non-outbox table ÷ alone, FOR TABLE publication":          "0.75×",
		"outboxd beside a busy non-outbox table, FOR ALL TABLES ÷ FOR TABLE publication": "0.50×",
		"live p99 at 1k ev/s beside outboxd replay ÷ alone":                              "2.00×",
	} {
		if got[name] != want {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}
	body := runsOf(rs).takeoverBody()
	for _, want := range []string{"### Backfill", "| outboxd_backfill | postgres.backfill | 25.0k | 12.5k | 1/4 |",
		"### Decoding beside a busy non-outbox table", "| outboxd_alltables | busy table beside, FOR ALL TABLES | 30.0k | 15.0k | 1/3 |",
		"### Live delivery during a replay", "| live-250B-replay | 2.0 ms | 8.0 ms |", "The replay: 1000 rows, 990 records/s", "Ratios of the medians"} {
		if !strings.Contains(body, want) {
			t.Errorf("report lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "PASS") || strings.Contains(body, "FAIL") {
		t.Errorf("the takeover figures have no targets:\n%s", body)
	}
	if b := runsOf(passing()).takeoverBody(); b != "" {
		t.Errorf("a run without the takeover sections has a takeover section:\n%s", b)
	}
}
