package main

import (
	"fmt"
	"strings"
)

// The shards section (issue 28): one fill decoded by 1, 2 and 4 slots whose
// publications split the aggregate ids with row filters, each slot read by
// a bare reader, and a slot of each share read alone.

const (
	shardFactor = 1.5 // decoding with 2 sharded slots ≥ this × one slot
	shards1     = "shards-1"
	shards2     = "shards-2"
	shards4     = "shards-4"
)

// shardAlone are the alone runs by share: the points of the cost model.
var shardAlone = []struct {
	workload string
	share    float64
}{{"shard-alone-1/1", 1}, {"shard-alone-1/2", 0.5}, {"shard-alone-1/4", 0.25}, {"shard-alone-0", 0}}

func totalSec(r result) float64 { return r.TotalSec }

// shardsTarget judges decoding with 2 sharded slots against one slot.
func (t runs) shardsTarget() verdict {
	v := verdict{target: "decoding with 2 sharded slots ≥ 1.5× one slot", on: "100-row tx"}
	two, ok2 := t.median("shards", shards2, "pg_walread", 0, throughput)
	one, ok1 := t.median("shards", shards1, "pg_walread", 0, throughput)
	if !ok1 || !ok2 || one == 0 {
		v.figure = "no run of the shards section"
		return v
	}
	v.value, v.judged = two/one, true
	v.shown, v.pass = times(v.value), v.value >= shardFactor
	v.figure = fmt.Sprintf("2 slots %s ev/s, 1 slot %s ev/s", kilo(two), kilo(one))
	if four, ok := t.median("shards", shards4, "pg_walread", 0, throughput); ok {
		v.figure += fmt.Sprintf(" (4 slots %s ev/s, %s)", kilo(four), times(four/one))
	}
	return v
}

// shardModel is the cost model of sharded decoding, fitted to the alone
// runs: a walsender takes fixed + share × output seconds for the fill, where
// fixed is what it spends reading and decoding all of the WAL (and
// evaluating its filter on every row) whatever its filter takes, and output
// what sending every row would cost, spread over the shards.
type shardModel struct {
	fixed, output float64 // seconds for the fill
	events        int
}

// model fits the medians of the alone runs by least squares; ok is false
// with fewer than two shares.
func (t runs) shardModel() (m shardModel, ok bool) {
	var xs, ys []float64
	for _, a := range shardAlone {
		if y, found := t.median("shards", a.workload, "pg_walread", 0, totalSec); found && y > 0 {
			xs, ys = append(xs, a.share), append(ys, y)
			if rs := t[runKey("shards", a.workload, "pg_walread", 0)]; len(rs) > 0 {
				m.events = rs[0].Events
			}
		}
	}
	if len(xs) < 2 || m.events == 0 {
		return m, false
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	k := float64(len(xs))
	m.output = (k*sxy - sx*sy) / (k*sxx - sx*sx)
	m.fixed = (sy - m.output*sx) / k
	return m, m.fixed > 0 && m.output > 0
}

// rate predicts the events/s of n shards on cores cores: each walsender
// needs fixed + output/n seconds, and all of them together n × fixed +
// output CPU-seconds on the cores (the readers, Kafka and outboxd not
// counted).
func (m shardModel) rate(n, cores int) float64 {
	wall := max(m.fixed+m.output/float64(n), (float64(n)*m.fixed+m.output)/float64(cores))
	return float64(m.events) / wall
}

// per100k converts seconds for the fill to seconds per 100k events.
func (m shardModel) per100k(sec float64) float64 { return sec / float64(m.events) * 1e5 }

// shardsBody renders the shards section's table and model; "" without runs.
func (b benchRun) shardsBody() string {
	t := b.t
	cases := []struct{ workload, name string }{
		{shards1, "1 slot, no row filter"},
		{shards2, "2 slots in parallel, a half of the keys each"},
		{shards4, "4 slots in parallel, a quarter of the keys each"},
		{"shard-alone-1/1", "1 slot alone, a row filter taking every key"},
		{"shard-alone-1/2", "1 slot alone, a half of the keys"},
		{"shard-alone-1/4", "1 slot alone, a quarter of the keys"},
		{"shard-alone-0", "1 slot alone, a row filter taking no key"},
	}
	var md strings.Builder
	one, hasOne := t.median("shards", shards1, "pg_walread", 0, throughput)
	for _, c := range cases {
		rs := t[runKey("shards", c.workload, "pg_walread", 0)]
		if len(rs) == 0 {
			continue
		}
		if md.Len() == 0 {
			md.WriteString("\n### Sharded decoding\n\nOne fill of 100-row transactions decoded by slots whose publications (inserts only) " +
				"take a share of the aggregate ids with a row filter on hashtext(aggregate_id), each slot read by a bare reader (pg_walread), " +
				"no Kafka. Events/s: the fill's events ÷ the time until every reader reached its end; walsender CPU of all its slots.\n\n")
			md.WriteString("| case | events/s | × 1 slot | time | walsender CPU-s per 100k |\n|---|--:|--:|--:|--:|\n")
		}
		tp := t.values("shards", c.workload, "pg_walread", 0, throughput)
		ratio := "–"
		if hasOne && one > 0 && c.workload != shards1 {
			ratio = fmt.Sprintf("%.2f×", median(tp)/one)
		}
		sec, _ := t.median("shards", c.workload, "pg_walread", 0, totalSec)
		cp, _ := t.median("shards", c.workload, "pg_walread", 0, cpu)
		fmt.Fprintf(&md, "| %s | %s | %s | %.2f s | %.2f |\n", c.name, spread(tp, kilo), ratio, sec, cp)
	}
	m, ok := t.shardModel()
	if !ok {
		return md.String()
	}
	fmt.Fprintf(&md, "\nCost model, fitted to the alone runs: a walsender spends %.2f s per 100k events of the fill whatever its filter takes "+
		"(reading and decoding the WAL, evaluating the filter), plus %.2f s per 100k rows it sends. ",
		m.per100k(m.fixed), m.per100k(m.output))
	pred := func(n, cores int) string {
		r := m.rate(n, cores)
		if hasOne && one > 0 {
			return fmt.Sprintf("%s ev/s (%s)", kilo(r), times(r/one))
		}
		return kilo(r) + " ev/s"
	}
	fmt.Fprintf(&md, "It predicts, counting only the walsenders' CPU: on this machine's 2 cores, 2 slots %s and 4 slots %s; "+
		"with as many cores as slots, 8 slots %s and 16 slots %s; never more than %s ev/s, one walsender's fixed cost.\n",
		pred(2, 2), pred(4, 2), pred(8, 8), pred(16, 16), kilo(float64(m.events)/m.fixed))
	return md.String()
}
