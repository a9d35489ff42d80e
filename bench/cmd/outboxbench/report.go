package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// cmdReport reads result lines (JSONL) and writes results.md plus gnuplot
// data files into -out.
func cmdReport(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	out := fs.String("out", "bench/results", "output directory")
	_ = fs.Parse(args)
	var rs []result
	for _, path := range fs.Args() {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var r result
			if err := json.Unmarshal(sc.Bytes(), &r); err == nil && r.Mode != "" {
				rs = append(rs, r)
			}
		}
		f.Close()
	}
	var md strings.Builder
	writeTargets(&md, judge(rs))
	md.WriteString("### Catch-up (events already in the WAL)\n\n")
	md.WriteString("| workload | contender | events | payload B | start-up s | total s | throughput ev/s | CPU s / 100k | peak RSS MB | RSS at drain MB | slot lag after drain B | load avg (start → end) | steal % |\n")
	md.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|\n")
	tp, _ := os.Create(filepath.Join(*out, "catchup.dat"))
	defer tp.Close()
	fmt.Fprintln(tp, "# workload contender throughput")
	for _, r := range rs {
		if r.Mode != "catchup" {
			continue
		}
		fmt.Fprintf(&md, "| %s | %s | %d | %d | %s | %.2f | %.0f | %.3f | %s | %s | %d | %s | %s |\n",
			r.Workload, r.Label, r.Events, r.PayloadBytes, opt(r.StartupSec, "%.3f"), r.TotalSec, r.Throughput,
			r.CPUPer100k, opt(r.PeakRSSMB, "%.0f"), opt(r.SteadyRSSMB, "%.0f"), r.SlotLagBytes, r.Load, steal(r.StealPct))
		fmt.Fprintf(tp, "%q %q %.0f\n", r.Workload, r.Label, r.Throughput)
	}
	md.WriteString("\n### Live (1-row transactions; latency = commit returned to the writer → Kafka LogAppendTime)\n\n")
	md.WriteString("| workload | contender | target ev/s | written ev/s | events | p50 ms | p99 ms | p99.9 ms | max ms | p99 in Postgres ms | CPU s / 100k | broker CPU s | steady RSS MB | peak RSS MB | slot lag B | load avg | steal % | note |\n")
	md.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|---|\n")
	lp, _ := os.Create(filepath.Join(*out, "live.dat"))
	defer lp.Close()
	fmt.Fprintln(lp, "# contender target p50 p99 max")
	for _, r := range rs {
		if r.Mode != "live" {
			continue
		}
		target := "max"
		if r.TargetRate > 0 {
			target = fmt.Sprintf("%.0f", r.TargetRate)
		}
		pgSend := "–"
		if r.PGSendP99ms != nil {
			pgSend = fmt.Sprintf("%.1f", *r.PGSendP99ms)
		}
		broker := "–"
		if r.BrokerCPUSec != nil {
			broker = fmt.Sprintf("%.2f", *r.BrokerCPUSec)
		}
		fmt.Fprintf(&md, "| %s | %s | %s | %.0f | %d | %.1f | %.1f | %.1f | %.1f | %s | %.3f | %s | %.0f | %.0f | %d | %s | %s | %s |\n",
			r.Workload, r.Label, target, r.WriteRate, r.Events, r.P50ms, r.P99ms, r.P999ms, r.Maxms, pgSend,
			r.CPUPer100k, broker, r.SteadyRSSMB, r.PeakRSSMB, r.SlotLagBytes, r.Load, steal(r.StealPct), r.Note)
		fmt.Fprintf(lp, "%q %q %.1f %.1f %.1f\n", r.Label, target, r.P50ms, r.P99ms, r.Maxms)
	}
	md.WriteString("\n### Idle outbox, writes to another table\n\n")
	md.WriteString("| contender | slot lag after the run B | CPU s | steady RSS MB | load avg | steal % | note |\n|---|--:|--:|--:|---|--:|---|\n")
	for _, r := range rs {
		if r.Mode != "idle" {
			continue
		}
		fmt.Fprintf(&md, "| %s | %d | %.2f | %.0f | %s | %s | %s |\n", r.Label, r.SlotLagBytes, r.CPUSeconds, r.SteadyRSSMB, r.Load, steal(r.StealPct), r.Note)
	}
	return os.WriteFile(filepath.Join(*out, "results.md"), []byte(md.String()), 0o644)
}

func opt(v float64, format string) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf(format, v)
}

// steal formats a result's steal share; results from before it was
// recorded have none.
func steal(pct *float64) string {
	if pct == nil {
		return "–"
	}
	return fmt.Sprintf("%.1f", *pct)
}
