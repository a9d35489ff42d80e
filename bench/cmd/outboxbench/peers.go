package main

import (
	"fmt"
	"slices"
	"strings"
)

// The peers: the other programs that do outboxd's job, each on its own
// slot in the same workloads. The Go ones are built from their published
// modules (bench/peers); one that cannot be set up on the machine leaves a
// result line of mode "unavailable" with the reason, and the targets are
// judged against the best of the peers that ran.
var peers = []string{"go_pq_cdc_kafka", "conduit", "debezium_default", "debezium_tuned"}

// Thresholds of the peer targets (issue 36).
const (
	peerFactor = 2.0 // catch-up ≥ this × the best peer's
	peerShare  = 0.5 // CPU per event and live p99 ≤ this × the best peer's
)

// unavailable maps each contender that could not be set up to the reason.
func unavailable(rs []result) map[string]string {
	u := map[string]string{}
	for _, r := range rs {
		if r.Mode == "unavailable" {
			u[r.Label] = r.Note
		}
	}
	return u
}

// bestPeer returns the peer with the best median of m (the highest when
// higher, else the lowest) among those that ran, and every peer's median.
func (t runs) bestPeer(mode, w string, rate float64, m metric, higher bool) (best string, value float64, others []string) {
	for _, c := range peers {
		v, ok := t.median(mode, w, c, rate, m)
		if !ok || v == 0 {
			continue
		}
		if best == "" || (higher && v > value) || (!higher && v < value) {
			best, value = c, v
		}
	}
	return best, value, nil
}

// vsPeers judges outboxd's median m against the best peer's: at least want
// times it when higher is better, at most want times it otherwise.
func (t runs) vsPeers(target, mode, w string, rate float64, m metric, higher bool, want float64, f func(float64) string, unit string, missing map[string]string) verdict {
	on := caseName[w]
	if mode == "live" {
		on = rateName(rate) + " ev/s"
	}
	v := verdict{target: target, on: on}
	o, ok := t.median(mode, w, "outboxd", rate, m)
	best, b, _ := t.bestPeer(mode, w, rate, m, higher)
	if !ok || best == "" {
		v.figure = missingPeers(ok, best != "")
		return v
	}
	v.value, v.judged = o/b, true
	v.shown = times(v.value)
	if higher {
		v.pass = v.value >= want
	} else {
		v.pass = v.value <= want
	}
	v.figure = fmt.Sprintf("outboxd %s%s, best peer %s %s%s", f(o), unit, best, f(b), unit)
	var rest []string
	for _, c := range peers {
		if c == best {
			continue
		}
		if x, ok := t.median(mode, w, c, rate, m); ok {
			rest = append(rest, fmt.Sprintf("%s %s", c, f(x)))
		} else if _, no := missing[c]; no {
			rest = append(rest, c+" not set up here")
		}
	}
	if len(rest) > 0 {
		v.figure += " (" + strings.Join(rest, ", ") + ")"
	}
	return v
}

func missingPeers(outboxd, peer bool) string {
	var no []string
	if !outboxd {
		no = append(no, "outboxd")
	}
	if !peer {
		no = append(no, "any peer")
	}
	return "no run of " + strings.Join(no, " or ")
}

// delivery judges the delivery check of every verified run: outboxd's
// builds lose and repeat nothing in a clean run; each peer's missing events
// and repeated records are counted beside it.
func delivery(rs []result) verdict {
	v := verdict{target: "every event delivered, none repeated (outboxd; the peers counted)", on: "every run"}
	type count struct{ runs, missing, repeated int }
	by := map[string]*count{}
	var labels []string
	for _, r := range rs {
		if !r.Verified {
			continue
		}
		c := by[r.Label]
		if c == nil {
			c = &count{}
			by[r.Label] = c
			labels = append(labels, r.Label)
		}
		c.runs++
		c.missing += r.Missing
		c.repeated += r.Repeated
	}
	ours := func(l string) bool { return l == "outboxd" || strings.HasPrefix(l, "outboxd_") }
	var figs []string
	bad := 0
	for _, l := range labels {
		c := by[l]
		if ours(l) {
			v.judged = true
			bad += c.missing + c.repeated
		} else if !slices.Contains(peers, l) {
			continue // kafka_raw writes what it counts itself
		}
		figs = append(figs, fmt.Sprintf("%s %d missing, %d repeated in %d runs", l, c.missing, c.repeated, c.runs))
	}
	if !v.judged {
		v.figure = "no run of outboxd with the delivery check"
		return v
	}
	v.value, v.pass = float64(bad), bad == 0
	v.shown = fmt.Sprintf("%d", bad)
	v.figure = strings.Join(figs, "; ")
	return v
}

// peersBody lists the peers that could not be set up, and why.
func peersBody(rs []result) string {
	u := unavailable(rs)
	if len(u) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n### Peers not set up on this machine\n\n")
	for _, c := range peers {
		if why, ok := u[c]; ok {
			fmt.Fprintf(&b, "- `%s`: %s\n", c, why)
		}
	}
	return b.String()
}
