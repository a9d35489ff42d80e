package main

import (
	"os/exec"
	"strings"
	"testing"
)

// probed is liveRun with a bare producer beside it (txn: a transactional one).
func probed(r result, txn bool, p50, p99, maxMs float64) result {
	r.BesideRate, r.BesideTxn, r.BesideP50ms, r.BesideP99ms, r.BesideMaxms = 100, txn, p50, p99, maxMs
	return r
}

// TestBesideRendering: the floor measured beside a live run shows in the
// targets' figures, the live table's "beside it" column and the run's
// note; results without it render as before (no column, no words).
func TestBesideRendering(t *testing.T) {
	rs := passing()
	for i, r := range rs {
		switch {
		case r.Mode != "live":
		case r.Label == "outboxd":
			rs[i] = probed(r, false, 2.5, 350, 420)
		case r.Label == "outboxd_eos":
			rs[i] = probed(r, true, 12, 480, 600)
		}
	}
	rs = append(rs, liveRun("outboxd_eos", 1000, 3.0, 2.4, 27)) // one run without a probe: the median is of those with one
	b := newRun(rs, "date: 2026-11-27T10:00:00Z\n")
	figures := map[string]string{}
	for _, v := range b.verdicts {
		figures[v.target+", "+v.on] = v.figure
	}
	for target, want := range map[string]string{
		"live p50 ≤ the floor + 1 ms (bare slot reader + raw producer), 5k ev/s":   "; a bare producer beside outboxd: p50 2.5 ms, p99 350.0 ms",
		"live p99 ≤ 1/20 of Debezium tuned's, 5k ev/s":                             "; a bare producer beside outboxd: p99 350.0 ms",
		"live p99 ≤ 1/2 of the best peer's, 5k ev/s":                               "; a bare producer beside outboxd: p99 350.0 ms",
		"outboxd_eos live p50 ≤ outboxd's + 5 ms (read_committed), 1k and 5k ev/s": "1k: outboxd_eos 3.0 ms, outboxd 1.0 ms, the same floor beside outboxd_eos 12.0 ms; 5k: outboxd_eos 4.2 ms, outboxd 1.2 ms, the same floor beside outboxd_eos 12.0 ms",
		"outboxd_eos live p99 ≤ 2× outboxd's (read_committed), 1k and 5k ev/s":     "the same floor beside outboxd_eos 480.0 ms",
	} {
		if got, ok := figures[target]; !ok || !strings.Contains(got, want) {
			t.Errorf("%s: figure %q, want it to contain %q", target, got, want)
		}
	}
	body := b.body()
	for _, want := range []string{
		" steady RSS | peak RSS | last event after the writers stopped | beside it |\n",
		"| 5k | outboxd | 0 | 1.2 ms | 9.0 ms (8.0 ms–300.0 ms) | 0.00 ms | – | 0.00 | – | 28 MB | – | 2.5 ms / 350.0 ms |\n",
		"| 5k | kafka_raw | 0 | 0.30 ms | 1.5 ms | 0.00 ms | – | 0.00 | – | – | – | – |\n",
		"| 1k | outboxd_eos | 0 | 3.0 ms | 2.4 ms (2.4 ms–2.4 ms) | 0.00 ms | – | 0.00 | – | 27 MB | – | 12.0 ms / 480.0 ms |\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("report body lacks %q:\n%s", want, body)
		}
	}
	if got, want := perRun(rs), "; beside it a bare transactional producer at 100 records/s: p50 12.0, p99 480.0, max 600.0 ms |"; !strings.Contains(got, want) {
		t.Errorf("every-run table lacks %q", want)
	}

	old := newRun(passing(), "date: 2026-11-27T10:00:00Z\n")
	for name, text := range map[string]string{"body": old.body(), "docBody": old.docBody(), "readme": old.readme(), "every run": perRun(passing())} {
		if strings.Contains(text, "beside") {
			t.Errorf("%s of results without a probe mentions one:\n%s", name, text)
		}
	}
}

// TestBesideProbeResult: the probe's result line (produce -rate) becomes
// the live run's beside_* fields; a probe that fails or prints no line is
// an error, which the live run logs and reports without its floor.
func TestBesideProbeResult(t *testing.T) {
	run := func(txn bool, out string) (result, error) {
		b := &besideProbe{cmd: exec.Command("echo", out), rate: 100, txn: txn}
		b.cmd.Stdout = &b.out
		if err := b.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		res := result{Label: "outboxd_eos"}
		return res, b.wait(&res)
	}
	res, err := run(true, `{"label":"outboxd_eos_beside","mode":"live","p50_ms":4.5,"p99_ms":9.25,"max_ms":31}`)
	if err != nil {
		t.Fatal(err)
	}
	if want := (result{Label: "outboxd_eos", BesideRate: 100, BesideTxn: true, BesideP50ms: 4.5, BesideP99ms: 9.25, BesideMaxms: 31}); res != want {
		t.Errorf("got %+v, want %+v", res, want)
	}
	if _, err := run(false, ""); err == nil || !strings.Contains(err.Error(), "printed no result line") {
		t.Errorf("a probe without a result line: %v", err)
	}
}
