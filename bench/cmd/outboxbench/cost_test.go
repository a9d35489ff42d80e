package main

import (
	"encoding/xml"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestFitLine(t *testing.T) {
	for _, tc := range []struct {
		name      string
		xs, ys    []float64
		a, b, r2  float64
		ok        bool
		tolerance float64
	}{
		{"exact line", []float64{1, 10, 100, 1000}, []float64{5.1, 5.19, 6.09, 15.09}, 5.09, 0.01, 1, true, 1e-9},
		{"flat", []float64{250, 4096, 65536}, []float64{60, 60, 60}, 60, 0, 1, true, 1e-9},
		{"noisy", []float64{1, 2, 3, 4}, []float64{1, 3, 2, 4}, 0.5, 0.8, 0.64, true, 1e-9},
		{"one point", []float64{10}, []float64{3}, 0, 0, 0, false, 0},
		{"one distinct x", []float64{10, 10}, []float64{3, 4}, 0, 0, 0, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, ok := fitLine(tc.xs, tc.ys)
			if ok != tc.ok {
				t.Fatalf("ok %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if math.Abs(l.a-tc.a) > tc.tolerance || math.Abs(l.b-tc.b) > tc.tolerance || math.Abs(l.r2-tc.r2) > tc.tolerance {
				t.Errorf("a %g, b %g, R² %g; want %g, %g, %g", l.a, l.b, l.r2, tc.a, tc.b, tc.r2)
			}
		})
	}
}

func TestFasterThanLinear(t *testing.T) {
	decades := []float64{1, 10, 100, 1000}
	of := func(f func(x float64) float64) []float64 {
		var ys []float64
		for _, x := range decades {
			ys = append(ys, f(x))
		}
		return ys
	}
	for _, tc := range []struct {
		name string
		ys   []float64
		want bool
	}{
		{"line", of(func(x float64) float64 { return 0.4 + 0.0005*x }), false},
		{"x log x", of(func(x float64) float64 { return 0.4 + 0.0005*x*math.Log(x+1) }), false},
		{"x^1.5", of(func(x float64) float64 { return 0.4 + 0.0005*math.Pow(x, 1.5) }), true},
		{"quadratic", of(func(x float64) float64 { return 1 + x*x }), true},
		{"flat with noise", []float64{0.40, 0.39, 0.40, 0.41}, false},
		{"flat, then up", []float64{0.40, 0.40, 0.39, 0.90}, true},
		{"falling", []float64{200, 150, 90, 20}, false},
		{"saturating", []float64{40, 60, 90, 100}, false},
		{"two points", []float64{1, 100}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			xs := decades[:len(tc.ys)]
			if got := fasterThanLinear(xs, tc.ys); got != tc.want {
				t.Errorf("fasterThanLinear(%v, %v) = %v, want %v", xs, tc.ys, got, tc.want)
			}
		})
	}
}

func TestCostWorkloadNames(t *testing.T) {
	for _, w := range costWorkloads(1000000) {
		curve, x, ok := costPoint(w.name)
		if !ok {
			t.Errorf("%s: not a cost point", w.name)
			continue
		}
		switch curve {
		case "topics":
			if int(x) != w.types {
				t.Errorf("%s: x %g, want %d topics", w.name, x, w.types)
			}
		case "tables":
			if int(x) != w.tables || !strings.Contains(w.tablesEnv("p"), "OUTBOXD_POSTGRES_TABLES=public.p_m0,") && w.tables > 1 {
				t.Errorf("%s: x %g, %d tables, environment %q", w.name, x, w.tables, w.tablesEnv("p"))
			}
		case "payload":
			if int(x) != w.size || w.maxMessage < w.size {
				t.Errorf("%s: x %g, size %d, max message %d", w.name, x, w.size, w.maxMessage)
			}
		case "buffer":
			if want := "OUTBOXD_KAFKA_MAX_BUFFERED_BYTES=" + strconv.Itoa(int(x)); w.outboxdEnvAdd != want {
				t.Errorf("%s: environment %q, want %q", w.name, w.outboxdEnvAdd, want)
			}
		default:
			t.Errorf("%s: curve %q", w.name, curve)
		}
		if w.n < 20 {
			t.Errorf("%s: %d events", w.name, w.n)
		}
	}
	if _, _, ok := costPoint("catchup-100tx-4KB"); ok {
		t.Error("catchup-100tx-4KB read as a cost point")
	}
}

// costRuns is a run of the cost section: the medians of its repeats make
// a line in topics and in payload bytes, and a curve of RSS against the
// buffer that rises faster than linearly.
func costRuns() []result {
	var rs []result
	add := func(w string, tp, cp, rss float64) {
		for _, f := range []float64{1, 0.8, 1.1} { // three repeats; the median is f = 1
			r := catchupRun("outboxd", w, tp*f, cp*f, rss*f, 0.05)
			r.Events = 1000
			rs = append(rs, r)
		}
	}
	for _, k := range costTopics {
		us := 5 + 0.01*float64(k)
		add("cost-topics-"+strconv.Itoa(k), 1e6/us, 0.4+0.001*float64(k), 60)
	}
	for _, k := range costTables {
		us := 6 + 0.02*float64(k)
		add("cost-tables-"+strconv.Itoa(k), 1e6/us, 0.5+0.002*float64(k), 70)
	}
	for _, b := range costPayloads {
		add("cost-payload-"+byteName(b), 1000, 0.4+float64(b)*1e-5, 50+float64(b)*1e-4)
	}
	for _, b := range costBuffers {
		mib := float64(b >> 20)
		add("cost-buffer-"+byteName(b), 1000, 2, 40+mib*mib)
	}
	return rs
}

func TestCostCurves(t *testing.T) {
	cs := costCurves(runsOf(append(passing(), costRuns()...)))
	want := map[string]struct {
		a, b  float64
		super bool
	}{
		"cost-topics-time.svg": {5, 0.01, false},
		"cost-topics-cpu.svg":  {0.4, 0.001, false},
		"cost-tables-time.svg": {6, 0.02, false},
		"cost-tables-cpu.svg":  {0.5, 0.002, false},
		"cost-payload-rss.svg": {50, 1e-4, false},
		"cost-payload-cpu.svg": {0.4, 1e-5, false},
		"cost-buffer-rss.svg":  {0, 0, true}, // (MiB)²: only the flag is checked
	}
	if len(cs) != len(want) {
		t.Fatalf("%d curves, want %d", len(cs), len(want))
	}
	for _, c := range cs {
		w, ok := want[c.file]
		if !ok {
			t.Errorf("unexpected curve %s", c.file)
			continue
		}
		points := 4
		if strings.HasPrefix(c.file, "cost-tables-") {
			points = len(costTables)
		}
		if len(c.xs) != points || !c.fitted || c.super != w.super {
			t.Errorf("%s: %d points, fitted %v, faster than linearly %v (want %v)", c.file, len(c.xs), c.fitted, c.super, w.super)
		}
		if !w.super && (math.Abs(c.fit.a-w.a) > 1e-6*math.Max(1, w.a) || math.Abs(c.fit.b-w.b) > 1e-9) {
			t.Errorf("%s: %s; want a %g, b %g", c.file, c.model(), w.a, w.b)
		}
		if w.super != strings.Contains(c.model(), "faster than linearly") {
			t.Errorf("%s: model %q", c.file, c.model())
		}
		var doc struct{ XMLName xml.Name }
		if err := xml.Unmarshal([]byte(svgPlot(c)), &doc); err != nil || doc.XMLName.Local != "svg" {
			t.Errorf("%s: not an SVG document: %v", c.file, err)
		}
	}
	body := costBody(runsOf(costRuns()), cs)
	for _, s := range []string{"| 1000 | 1000 | 66.7k | 15.00 | 1.40 | 60 MB |", "| 1MB |", "| 128MiB |", "| 100 | 1000 | 125.0k | 8.00 | 0.70 | 70 MB |",
		"[µs per event](cost-topics-time.svg): µs per event ≈ 5 + 0.01 per topic"} {
		if !strings.Contains(body, s) {
			t.Errorf("the cost report has no %q:\n%s", s, body)
		}
	}
	// kafka_raw beside outboxd on the topics curve: a column of its own,
	// and the curves stay outboxd's.
	withRaw := costRuns()
	for _, k := range costTopics {
		r := catchupRun("kafka_raw", "cost-topics-"+strconv.Itoa(k), 200000/float64(k), 0.1, 30, 0)
		r.Events = 1000
		withRaw = append(withRaw, r)
	}
	rawCurves := costCurves(runsOf(withRaw))
	if len(rawCurves) != len(cs) || rawCurves[0].fit != cs[0].fit {
		t.Errorf("kafka_raw's runs changed the curves: %+v", rawCurves[0])
	}
	body = costBody(runsOf(withRaw), rawCurves)
	for _, s := range []string{"| topics | events | events/s | kafka_raw events/s |", "| 1000 | 1000 | 66.7k | 200 | 15.00 | 1.40 | 60 MB |"} {
		if !strings.Contains(body, s) {
			t.Errorf("the cost report with kafka_raw has no %q:\n%s", s, body)
		}
	}
	if got := costBody(runsOf(passing()), nil); !strings.Contains(got, "NOT RUN") {
		t.Errorf("a run without the cost section: %q", got)
	}
}

func TestByteName(t *testing.T) {
	for _, b := range append(append(slices.Clone(costPayloads), costBuffers...), 1000) {
		n, err := parseByteName(byteName(b))
		if err != nil || n != b {
			t.Errorf("%d: %s read back as %d, %v", b, byteName(b), n, err)
		}
	}
	if _, err := parseByteName("12"); err == nil {
		t.Error("a size without a unit was read")
	}
}
