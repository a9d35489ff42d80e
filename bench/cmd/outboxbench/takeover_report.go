package main

import (
	"fmt"
	"strings"
)

// report.md's section of the takeover sections (issue 35, acceptance 2):
// figures and their ratios, with no PASS or FAIL (the issue names no
// threshold). BENCHMARKS.md states the method and links here.

// ratio is one comparison of the takeover sections: what is divided by
// what, and the quotient of the medians (0 when either did not run).
type ratio struct {
	name  string
	value float64
}

func (r ratio) String() string { return fmt.Sprintf("%s: %s", r.name, times(r.value)) }

// takeoverRatios are the comparisons the issue asks for, where their runs
// are in the results.
func (t runs) takeoverRatios() []ratio {
	var rs []ratio
	add := func(name string, a, b float64, okA, okB bool) {
		if okA && okB && a > 0 && b > 0 {
			rs = append(rs, ratio{name, a / b})
		}
	}
	wall := func(r result) float64 { return r.WallRate }
	catchup := func(w, c string, m metric) (float64, bool) { return t.median("catchup", w, c, 0, m) }
	bf, okBF := catchup(backfillWorkload, "outboxd_backfill", throughput)
	bfWall, _ := catchup(backfillWorkload, "outboxd_backfill", wall)
	cp, okCP := catchup(backfillWorkload, "pg_copy", throughput)
	sl, okSL := catchup(backfillWorkload, "outboxd", throughput)
	add("backfill ÷ COPY of the same rows (rows/s, first → last record)", bf, cp, okBF, okCP)
	add("backfill ÷ COPY of the same rows (rows/s, outboxd's start → last record)", bfWall, cp, okBF, okCP)
	add("backfill ÷ outboxd's catch-up of the same rows from a slot", bf, sl, okBF, okSL)
	alone, okA := catchup(multitableAlone, "outboxd", throughput)
	busy, okB := catchup(multitableBusy, "outboxd", throughput)
	all, okAll := catchup(multitableBusy, "outboxd_alltables", throughput)
	add("outboxd beside a busy non-outbox table ÷ alone, FOR TABLE publication", busy, alone, okB, okA)
	add("outboxd beside a busy non-outbox table, FOR ALL TABLES ÷ FOR TABLE publication", all, busy, okAll, okB)
	p99A, okA := t.median("live", replayLiveAlone, "outboxd", replayLiveRate, p99)
	p99B, okB := t.median("live", replayLiveBeside, "outboxd", replayLiveRate, p99)
	add("live p99 at 1k ev/s beside outboxd replay ÷ alone", p99B, p99A, okB, okA)
	return rs
}

// delivered sums the lost and repeated events of a contender's verified
// runs: "0 / 0", or "–" when none was checked.
func (t runs) delivered(mode, w, c string, rate float64) string {
	lost, rep, checked := 0, 0, false
	for _, r := range t[runKey(mode, w, c, rate)] {
		if r.Verified {
			lost, rep, checked = lost+r.Missing, rep+r.Repeated, true
		}
	}
	if !checked {
		return "–"
	}
	return fmt.Sprintf("%d / %d", lost, rep)
}

// takeoverBody is the section of report.md; empty when no takeover section ran.
func (t runs) takeoverBody() string {
	var md strings.Builder
	catchupRow := func(w, c, what string, base float64) {
		tp := t.values("catchup", w, c, 0, throughput)
		if len(tp) == 0 {
			return
		}
		wall := t.values("catchup", w, c, 0, func(r result) float64 { return r.WallRate })
		vs := "–"
		if base > 0 && c != "pg_copy" {
			vs = times(median(tp) / base)
		}
		rss := "–"
		if v, _ := t.median("catchup", w, c, 0, peakRSS); v > 0 {
			rss = mb(v)
		}
		cp, _ := t.median("catchup", w, c, 0, cpu)
		fmt.Fprintf(&md, "| %s | %s | %s | %s | %s | %.2f | %s | %s |\n", c, what, spread(tp, kilo), kilo(median(wall)), vs, cp, rss,
			t.delivered("catchup", w, c, 0))
	}
	header := "| contender | what | rows/s | from start | × %s | CPU-s per 100k | peak RSS | lost / repeated |\n|---|---|--:|--:|--:|--:|--:|--:|\n"
	if rs := t[runKey("catchup", backfillWorkload, "outboxd_backfill", 0)]; len(rs) > 0 {
		fmt.Fprintf(&md, "\n### Backfill (issue 35 §2)\n\n%d rows already in the table before outboxd's slot exists (250 B, written in 100-row transactions), "+
			"delivered by `postgres.backfill` (`where: \"true\"`, `order_by` created_at). Rows/s from the first to the last record appended in Kafka; "+
			"\"from start\" counts from outboxd's start, so it includes creating the slot and copying the rows into the backfill's key table. "+
			"pg_copy, the limit: `%s`, read to nothing (its time is the statement's; CPU is the backend's). "+
			"outboxd: its catch-up of the same rows from a slot made before they were written.\n\n", rs[0].Events, backfillCopy)
		fmt.Fprintf(&md, header, "pg_copy")
		base, _ := t.median("catchup", backfillWorkload, "pg_copy", 0, throughput)
		catchupRow(backfillWorkload, "pg_copy", "COPY (SELECT …) TO STDOUT, the limit", 0)
		catchupRow(backfillWorkload, "outboxd_backfill", "postgres.backfill", base)
		catchupRow(backfillWorkload, "outboxd", "catch-up from a slot", base)
	}
	if len(t[runKey("catchup", multitableBusy, "outboxd", 0)]) > 0 {
		fmt.Fprintf(&md, "\n### Decoding beside a busy non-outbox table (issue 35 §1)\n\n"+
			"multitable-busy writes, in each 100-row transaction of events, 100 rows of about the same size to a table that is not an outbox; "+
			"multitable-alone writes the events only. outboxd and pg_recvlogical read the publication outboxd uses for several tables, one that "+
			"lists them (`FOR TABLE`); the _alltables contenders read a `FOR ALL TABLES` publication, which publishes the other table's rows too, "+
			"for outboxd to parse and drop (the alternative issue 35 named for tables created at runtime). "+
			"Events/s count the outbox events only; pg_recvlogical: decoding only, to /dev/null, process start to exit.\n\n")
		fmt.Fprintf(&md, strings.Replace(header, "| what | rows/s |", "| fill, publication | events/s |", 1), "the same reader on events alone")
		for _, row := range []struct{ w, c, what string }{
			{multitableAlone, "pg_recvlogical", "events alone, FOR TABLE"},
			{multitableAlone, "outboxd", "events alone, FOR TABLE"},
			{multitableBusy, "pg_recvlogical", "busy table beside, FOR TABLE"},
			{multitableBusy, "outboxd", "busy table beside, FOR TABLE"},
			{multitableBusy, "pg_recvlogical_alltables", "busy table beside, FOR ALL TABLES"},
			{multitableBusy, "outboxd_alltables", "busy table beside, FOR ALL TABLES"},
		} {
			reader := strings.TrimSuffix(row.c, "_alltables")
			base := 0.0
			if row.w != multitableAlone {
				base, _ = t.median("catchup", multitableAlone, reader, 0, throughput)
			}
			catchupRow(row.w, row.c, row.what, base)
		}
	}
	if len(t[runKey("live", replayLiveBeside, "outboxd", replayLiveRate)]) > 0 {
		md.WriteString("\n### Live delivery during a replay (issue 35 §3)\n\n" +
			"outboxd's live run at 1k events/s (one-row transactions, 8 writers; commit → visible to a read_committed consumer), " +
			"once alone and once beside `outboxd replay` of rows written before the run, at its default rate (1,000 records/s, " +
			"pages of 500, read through an index on created_at), which lasts the whole run; the table holds those rows both times.\n\n" +
			"| live at 1k ev/s | p50 | p99 | p99.9 | max | CPU-s per 100k | lost / repeated |\n|---|--:|--:|--:|--:|--:|--:|\n")
		for _, w := range []string{replayLiveAlone, replayLiveBeside} {
			col := func(m metric) []float64 { return t.values("live", w, "outboxd", replayLiveRate, m) }
			if len(col(p99)) == 0 {
				continue
			}
			fmt.Fprintf(&md, "| %s | %s | %s | %s | %s | %.2f | %s |\n", w, ms(median(col(p50))), spread(col(p99), ms),
				ms(median(col(func(r result) float64 { return r.P999ms }))), ms(median(col(func(r result) float64 { return r.Maxms }))),
				median(col(cpu)), t.delivered("live", w, "outboxd", replayLiveRate))
		}
		if tp := t.values("catchup", replayWorkload, "outboxd_replay", 0, throughput); len(tp) > 0 {
			rs := t[runKey("catchup", replayWorkload, "outboxd_replay", 0)]
			fmt.Fprintf(&md, "\nThe replay: %d rows, %s records/s from its first to its last record, lost / repeated %s.\n",
				rs[0].Events, spread(tp, kilo), t.delivered("catchup", replayWorkload, "outboxd_replay", 0))
		}
	}
	if md.Len() == 0 {
		return ""
	}
	md.WriteString("\nRatios of the medians:\n\n")
	for _, r := range t.takeoverRatios() {
		fmt.Fprintf(&md, "- %s\n", r)
	}
	return md.String()
}
