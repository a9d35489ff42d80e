package main

import (
	"errors"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The cost section (issue 36 §4): how outboxd's cost grows with the number
// of topics (aggregate types), of outbox tables on the slot, the payload size and
// kafka.max_buffered_bytes. Each point is a catch-up of outboxd
// (100-row transactions), catchupRepeat times from one fill, under a
// workload named cost-<curve>-<x>; the topics curve's points also run
// kafka_raw, the same events produced by a bare producer, which tells the
// broker's cost of many topics from outboxd's. The report fits a least-squares line
// to each curve, states it beside the curve's table and plot, and flags a
// curve that grows faster than linearly.

var (
	costCurveNames = []string{"topics", "tables", "payload", "buffer"}
	costTopics     = []int{1, 10, 100, 1000}
	costTables     = []int{1, 10, 100}
	costPayloads   = []int{250, 4 << 10, 64 << 10, 1 << 20}
	costBuffers    = []int{4 << 20, 16 << 20, 32 << 20, 128 << 20} // 32 MiB is the default
)

const (
	costBufferPayload = 64 << 10 // the events of the max_buffered_bytes curve
	// costMaxMessage is kafka.max_message_bytes along the payload curve
	// (and the topics' max.message.bytes, 10 % more): a 1 MB event is over
	// the default of 1,000,000 B. Every point of the curve has it, so that
	// the producer's batches are capped alike.
	costMaxMessage = 2 << 20
)

// costWorkloads are the cost section's catch-up workloads for n events
// (the payload and buffer curves write fewer, larger events).
func costWorkloads(n int) []workload {
	var ws []workload
	for _, k := range costTopics {
		ws = append(ws, workload{name: fmt.Sprintf("cost-topics-%d", k), n: n, tx: 100, size: 250, types: k})
	}
	for _, k := range costTables {
		ws = append(ws, workload{name: fmt.Sprintf("cost-tables-%d", k), n: n, tx: 100, size: 250, tables: k})
	}
	events := map[int]int{250: n / 10, 4 << 10: n / 10, 64 << 10: n / 100, 1 << 20: n / 1000}
	for _, b := range costPayloads {
		ws = append(ws, workload{name: "cost-payload-" + byteName(b), n: max(events[b], 20), tx: 100, size: b, maxMessage: costMaxMessage})
	}
	for _, b := range costBuffers {
		ws = append(ws, workload{name: "cost-buffer-" + byteName(b), n: max(n/100, 20), tx: 100, size: costBufferPayload,
			outboxdEnvAdd: "OUTBOXD_KAFKA_MAX_BUFFERED_BYTES=" + strconv.Itoa(b)})
	}
	return ws
}

// byteName names a size: 250B, 4KB, 64KB, 1MB; MiB from 2 MiB (the buffer sizes).
func byteName(b int) string {
	switch {
	case b >= 2<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", b>>20)
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%dMB", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%dKB", b>>10)
	}
	return fmt.Sprintf("%dB", b)
}

// parseByteName reads byteName's forms back.
func parseByteName(s string) (int, error) {
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"MiB", 1 << 20}, {"MB", 1 << 20}, {"KB", 1 << 10}, {"B", 1}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				return 0, fmt.Errorf("size %q: %w", s, err)
			}
			return n * u.mult, nil
		}
	}
	return 0, fmt.Errorf("size %q has no unit (B, KB, MB, MiB)", s)
}

// costPoint reads a cost workload's curve and x: cost-topics-100 is
// ("topics", 100), cost-payload-4KB ("payload", 4096).
func costPoint(w string) (curve string, x float64, ok bool) {
	rest, ok := strings.CutPrefix(w, "cost-")
	if !ok {
		return "", 0, false
	}
	curve, v, ok := strings.Cut(rest, "-")
	if !ok {
		return "", 0, false
	}
	var n int
	var err error
	if curve == "topics" || curve == "tables" {
		n, err = strconv.Atoi(v)
	} else {
		n, err = parseByteName(v)
	}
	return curve, float64(n), err == nil
}

// line is a least-squares line y = a + b·x.
type line struct {
	a, b, r2 float64
}

func (l line) at(x float64) float64 { return l.a + l.b*x }

// fitLine fits y = a + b·x by least squares; ok is false with fewer than
// two distinct x.
func fitLine(xs, ys []float64) (line, bool) {
	n := float64(len(xs))
	if len(xs) < 2 || len(xs) != len(ys) {
		return line{}, false
	}
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx, my = mx/n, my/n
	var sxx, sxy, syy float64
	for i := range xs {
		dx, dy := xs[i]-mx, ys[i]-my
		sxx += dx * dx
		sxy += dx * dy
		syy += dy * dy
	}
	if sxx == 0 {
		return line{}, false
	}
	l := line{b: sxy / sxx}
	l.a = my - l.b*mx
	l.r2 = 1
	if syy > 0 {
		l.r2 = sxy * sxy / (sxx * syy)
	}
	return l, true
}

// Faster than linearly: the slope of a curve's last segment is at least
// superSlope times the slope of the segment before it, and the last
// segment adds at least superShare of the last value (so that noise on a
// flat curve is no finding). A line has equal slopes; x·log x over the
// decades of x here about 1.5×; x^1.5 about 3×; x² 10×.
const (
	superSlope = 2.0
	superShare = 0.05
)

// fasterThanLinear judges points sorted by x.
func fasterThanLinear(xs, ys []float64) bool {
	n := len(xs)
	if n < 3 {
		return false
	}
	last := (ys[n-1] - ys[n-2]) / (xs[n-1] - xs[n-2])
	before := (ys[n-2] - ys[n-3]) / (xs[n-2] - xs[n-3])
	if last <= 0 || ys[n-1]-ys[n-2] < superShare*math.Abs(ys[n-1]) {
		return false
	}
	return before <= 0 || last >= superSlope*before
}

// curve is one cost curve: its points (medians of the runs), its fitted
// line and whether it grows faster than linearly.
type curve struct {
	file, title   string
	xName, yName  string // axis names
	xUnit         string // the model's unit of x: "topic", "payload byte"
	xs, ys        []float64
	xFmt          func(float64) string
	fit           line
	fitted, super bool
}

// model states the curve's fitted line in words.
func (c curve) model() string {
	if !c.fitted {
		return "no model: fewer than two points"
	}
	s := fmt.Sprintf("%s ≈ %s + %s per %s (least squares, R² %.2f)", c.yName, num(c.fit.a), num(c.fit.b), c.xUnit, c.fit.r2)
	if c.super {
		s += "; grows faster than linearly: a finding to fix or explain"
	}
	return s
}

// num formats a fitted parameter with three significant digits.
func num(v float64) string {
	if v == 0 {
		return "0"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// costCurves builds the cost curves of a run's results.
func costCurves(t runs) []curve {
	point := func(curveName string, m metric) (xs, ys []float64) {
		type pt struct{ x, y float64 }
		var pts []pt
		seen := map[string]bool{}
		for k, rs := range t {
			r := rs[0]
			name, x, ok := costPoint(r.Workload)
			if r.Mode != "catchup" || r.Label != "outboxd" || name != curveName || !ok || seen[k] {
				continue
			}
			seen[k] = true
			y, _ := t.median("catchup", r.Workload, "outboxd", 0, m)
			pts = append(pts, pt{x, y})
		}
		slices.SortFunc(pts, func(a, b pt) int { return int(math.Copysign(1, a.x-b.x)) })
		for _, p := range pts {
			xs, ys = append(xs, p.x), append(ys, p.y)
		}
		return xs, ys
	}
	usPerEvent := func(r result) float64 {
		if r.Throughput <= 0 {
			return 0
		}
		return 1e6 / r.Throughput
	}
	topics := func(x float64) string { return fmt.Sprintf("%.0f", x) }
	bytesF := func(x float64) string { return byteName(int(x)) }
	defs := []struct {
		curve string
		c     curve
		m     metric
	}{
		{"topics", curve{file: "cost-topics-time.svg", title: "outboxd catch-up: time per event against topics",
			xName: "topics (aggregate types)", yName: "µs per event", xUnit: "topic", xFmt: topics}, usPerEvent},
		{"topics", curve{file: "cost-topics-cpu.svg", title: "outboxd catch-up: CPU per event against topics",
			xName: "topics (aggregate types)", yName: "CPU-s per 100k events", xUnit: "topic", xFmt: topics}, cpu},
		{"tables", curve{file: "cost-tables-time.svg", title: "outboxd catch-up: time per event against outbox tables",
			xName: "outbox tables (one slot)", yName: "µs per event", xUnit: "table", xFmt: topics}, usPerEvent},
		{"tables", curve{file: "cost-tables-cpu.svg", title: "outboxd catch-up: CPU per event against outbox tables",
			xName: "outbox tables (one slot)", yName: "CPU-s per 100k events", xUnit: "table", xFmt: topics}, cpu},
		{"payload", curve{file: "cost-payload-rss.svg", title: "outboxd catch-up: peak RSS against payload size",
			xName: "payload bytes", yName: "peak RSS MB", xUnit: "payload byte", xFmt: bytesF}, peakRSS},
		{"payload", curve{file: "cost-payload-cpu.svg", title: "outboxd catch-up: CPU per event against payload size",
			xName: "payload bytes", yName: "CPU-s per 100k events", xUnit: "payload byte", xFmt: bytesF}, cpu},
		{"buffer", curve{file: "cost-buffer-rss.svg", title: "outboxd catch-up of 64 KB events: peak RSS against kafka.max_buffered_bytes",
			xName: "kafka.max_buffered_bytes", yName: "peak RSS MB", xUnit: "buffered byte", xFmt: bytesF}, peakRSS},
	}
	var cs []curve
	for _, d := range defs {
		c := d.c
		c.xs, c.ys = point(d.curve, d.m)
		if len(c.xs) == 0 {
			continue
		}
		c.fit, c.fitted = fitLine(c.xs, c.ys)
		c.super = fasterThanLinear(c.xs, c.ys)
		cs = append(cs, c)
	}
	return cs
}

// costBody is the report's section on the cost section: a table per curve
// with its model, and the plots' files. Empty when the run has no cost
// section and says so.
func costBody(t runs, cs []curve) string {
	var md strings.Builder
	md.WriteString("\n### How cost grows\n\n")
	if len(cs) == 0 {
		md.WriteString("NOT RUN: no run of the cost section (`bench/run full cost`).\n")
		return md.String()
	}
	md.WriteString("outboxd drains 100-row transactions from its own slot (on the topics curve kafka_raw produces the same events beside it); medians of the runs. " +
		"Each curve's model is a least-squares line; a curve is flagged when the slope of its last segment is at least " +
		fmt.Sprintf("%.0f× the one before it (and adds at least %.0f %% of the last value).\n\n", superSlope, superShare*100))
	table := func(curveName, head string, row func(w string) string) {
		var ws []string
		for _, rs := range t {
			if name, _, ok := costPoint(rs[0].Workload); ok && name == curveName && rs[0].Label == "outboxd" && rs[0].Mode == "catchup" {
				ws = append(ws, rs[0].Workload)
			}
		}
		if len(ws) == 0 {
			return
		}
		slices.SortFunc(ws, func(a, b string) int {
			_, x, _ := costPoint(a)
			_, y, _ := costPoint(b)
			return int(math.Copysign(1, x-y))
		})
		md.WriteString(head)
		for _, w := range ws {
			md.WriteString(row(w))
		}
		md.WriteString("\n")
		for _, c := range cs {
			if strings.HasPrefix(c.file, "cost-"+curveName+"-") {
				fmt.Fprintf(&md, "- [%s](%s): %s\n", c.yName, c.file, c.model())
			}
		}
		md.WriteString("\n")
	}
	figures := func(w string) (tp, cp, rss float64, n int) {
		tp, _ = t.median("catchup", w, "outboxd", 0, throughput)
		cp, _ = t.median("catchup", w, "outboxd", 0, cpu)
		rss, _ = t.median("catchup", w, "outboxd", 0, peakRSS)
		rs := t[runKey("catchup", w, "outboxd", 0)]
		return tp, cp, rss, rs[0].Events
	}
	// A count curve's row: topics or tables, the time and CPU per event.
	countRow := func(w string) string {
		_, x, _ := costPoint(w)
		tp, cp, rss, n := figures(w)
		us := 0.0
		if tp > 0 {
			us = 1e6 / tp
		}
		return fmt.Sprintf("| %.0f | %d | %s | %.2f | %.2f | %s |\n", x, n, kilo(tp), us, cp, mb(rss))
	}
	const countHead = " | events | events/s | µs per event | CPU-s per 100k | peak RSS |\n|--:|--:|--:|--:|--:|--:|\n"
	// The topics' rows add kafka_raw's rate where it ran: the broker's own
	// cost of the topics, with no Postgres and no outboxd.
	raw := func(w string) (float64, bool) { return t.median("catchup", w, "kafka_raw", 0, throughput) }
	if _, ok := raw(fmt.Sprintf("cost-topics-%d", costTopics[len(costTopics)-1])); ok {
		table("topics", "| topics | events | events/s | kafka_raw events/s | µs per event | CPU-s per 100k | peak RSS |\n|--:|--:|--:|--:|--:|--:|--:|\n", func(w string) string {
			r := countRow(w)
			rp, _ := raw(w)
			cells := strings.SplitN(r, " | ", 4) // "| x", n, rate, rest
			return strings.Join(cells[:3], " | ") + " | " + kilo(rp) + " | " + cells[3]
		})
	} else {
		table("topics", "| topics"+countHead, countRow)
	}
	table("tables", "| outbox tables"+countHead, countRow)
	table("payload", "| payload | events | events/s | MB/s | CPU-s per 100k | peak RSS |\n|--:|--:|--:|--:|--:|--:|\n", func(w string) string {
		_, x, _ := costPoint(w)
		tp, cp, rss, n := figures(w)
		return fmt.Sprintf("| %s | %d | %s | %.1f | %.2f | %s |\n", byteName(int(x)), n, kilo(tp), tp*x/1e6, cp, mb(rss))
	})
	table("buffer", "| kafka.max_buffered_bytes (64 KB events) | events | events/s | CPU-s per 100k | peak RSS |\n|--:|--:|--:|--:|--:|\n", func(w string) string {
		_, x, _ := costPoint(w)
		tp, cp, rss, n := figures(w)
		return fmt.Sprintf("| %s | %d | %s | %.2f | %s |\n", byteName(int(x)), n, kilo(tp), cp, mb(rss))
	})
	return md.String()
}

// writeCostPlots writes each curve's SVG into dir.
func writeCostPlots(dir string, cs []curve) error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, os.WriteFile(filepath.Join(dir, c.file), []byte(svgPlot(c)), 0o644))
	}
	return errors.Join(errs...)
}

// svgPlot draws a curve: its points joined, its fitted line dashed, on a
// logarithmic x axis (the points span decades), the model beneath.
func svgPlot(c curve) string {
	const w, h, left, right, top, bottom = 720.0, 440.0, 80.0, 30.0, 40.0, 90.0
	x0, x1 := slices.Min(c.xs), slices.Max(c.xs)
	if x0 <= 0 {
		x0 = 1
	}
	lx0, lx1 := math.Log10(x0)-0.15, math.Log10(max(x1, x0*10))+0.15
	samples := 60
	var fitX, fitY []float64
	if c.fitted {
		for i := range samples + 1 {
			x := math.Pow(10, math.Log10(x0)+(math.Log10(max(x1, x0))-math.Log10(x0))*float64(i)/float64(samples))
			fitX, fitY = append(fitX, x), append(fitY, c.fit.at(x))
		}
	}
	ymax := slices.Max(c.ys)
	if len(fitY) > 0 {
		ymax = max(ymax, slices.Max(fitY))
	}
	step := niceStep(ymax / 5)
	ytop := math.Ceil(ymax*1.05/step) * step
	if ytop <= 0 {
		ytop, step = 1, 0.2
	}
	px := func(x float64) float64 { return left + (math.Log10(x)-lx0)/(lx1-lx0)*(w-left-right) }
	py := func(y float64) float64 { return h - bottom - math.Max(0, y)/ytop*(h-top-bottom) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%.0f" height="%.0f" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%.0f" y="22" text-anchor="middle" font-size="14">%s</text>`+"\n", w/2, html.EscapeString(c.title))
	fmt.Fprintf(&b, `<path d="M%.1f %.1f V%.1f H%.1f" fill="none" stroke="black"/>`+"\n", left, top, h-bottom, w-right)
	for y := 0.0; y <= ytop+step/2; y += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n",
			left, py(y), w-right, py(y), left-6, py(y)+4, num(y))
	}
	for _, x := range c.xs {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/><text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n",
			px(x), h-bottom, px(x), h-bottom+5, px(x), h-bottom+18, html.EscapeString(c.xFmt(x)))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s (logarithmic)</text>`+"\n", (left+w-right)/2, h-bottom+36, html.EscapeString(c.xName))
	fmt.Fprintf(&b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", (top+h-bottom)/2, html.EscapeString(c.yName))
	poly := func(xs, ys []float64, style string) {
		var pts []string
		for i := range xs {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(xs[i]), py(ys[i])))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" %s/>`+"\n", strings.Join(pts, " "), style)
	}
	if c.fitted {
		poly(fitX, fitY, `stroke="#c33" stroke-width="1.5" stroke-dasharray="6 4"`)
	}
	poly(c.xs, c.ys, `stroke="#236" stroke-width="2"`)
	for i := range c.xs {
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" fill="#236"/>`+"\n", px(c.xs[i]), py(c.ys[i]))
	}
	color := "#333"
	if c.super {
		color = "#c00"
	}
	model, flag, _ := strings.Cut(c.model(), "; ") // the flag on a line of its own
	fmt.Fprintf(&b, `<text x="20" y="%.0f" font-size="11">dashed: %s</text>`+"\n", h-30, html.EscapeString(model))
	if flag != "" {
		fmt.Fprintf(&b, `<text x="20" y="%.0f" font-size="11" fill="%s">%s</text>`+"\n", h-12, color, html.EscapeString(flag))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceStep rounds a step up to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
