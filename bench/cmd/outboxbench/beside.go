package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"time"
)

// The floor beside a run. kafka_raw and kafka_raw_eos measure the broker
// alone: no Postgres writers, walsender, contender or measuring consumer on
// the two cores beside them. Beside an outboxd run at 1k events/s a bare
// producer's p99 was 347–591 ms where alone it was 7.5 ms, its stalls in
// the same seconds as outboxd's (the broker's appends and collections and
// the walsender, sharing the cores). So every live run of the live section
// also runs a bare producer beside the contender, at a low rate to a topic
// of its own, and the result line carries its latency (beside_*): what the
// broker allowed in those seconds, the contender's floor in its own run.

// besidePrefix is the topic prefix of the probe beside a live run of
// prefix: one topic, <prefix>_beside_t0-events, made (and warmed) by the
// plan with the run's topics.
func besidePrefix(prefix string) string { return prefix + "_beside" }

// besideProbe is `outboxbench produce -rate` run beside a live run: the
// produce code kafka_raw and kafka_raw_eos use, in a process of its own as
// theirs is, its result line read back from its stdout.
type besideProbe struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	rate float64
	txn  bool
}

// startBeside starts the probe for a live run of c: rate records/s for
// duration, the first warmup not counted, as the run's writers; with txn
// in transactions committed back to back, timed to the commit marker
// (kafka_raw_eos). The probe ends with ctx.
func startBeside(ctx context.Context, c common, rate float64, txn bool, duration, warmup time.Duration) (*besideProbe, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("starting the probe beside %s: %w", c.label, err)
	}
	args := []string{"produce", "-brokers", c.brokers, "-prefix", besidePrefix(c.prefix), "-types", "1",
		"-label", c.label + "_beside", "-workload", c.workload, "-rate", strconv.FormatFloat(rate, 'f', -1, 64),
		"-duration", duration.String(), "-warmup", warmup.String()}
	if txn {
		args = append(args, "-txn")
	}
	b := &besideProbe{cmd: exec.CommandContext(ctx, self, args...), rate: rate, txn: txn}
	b.cmd.Stdout, b.cmd.Stderr = &b.out, os.Stderr
	if err := b.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the probe beside %s: %w", c.label, err)
	}
	return b, nil
}

// wait waits for the probe to end and puts its latency into res.
func (b *besideProbe) wait(res *result) error {
	if err := b.cmd.Wait(); err != nil {
		return fmt.Errorf("the probe beside %s: %w", res.Label, err)
	}
	var r result
	if err := json.Unmarshal(bytes.TrimSpace(b.out.Bytes()), &r); err != nil {
		return fmt.Errorf("the probe beside %s printed no result line: %w", res.Label, err)
	}
	res.BesideRate, res.BesideTxn = b.rate, b.txn
	res.BesideP50ms, res.BesideP99ms, res.BesideMaxms = r.P50ms, r.P99ms, r.Maxms
	return nil
}

func besideP50(r result) float64 { return r.BesideP50ms }
func besideP99(r result) float64 { return r.BesideP99ms }

// beside returns the median of m over c's live runs at rate that had a
// probe beside them, and whether any had.
func (t runs) beside(c string, rate float64, m metric) (float64, bool) {
	var vs []float64
	for _, r := range t[runKey("live", live250, c, rate)] {
		if r.BesideRate > 0 {
			vs = append(vs, m(r))
		}
	}
	return median(vs), len(vs) > 0
}

// besideFigure says what the bare producer beside c's live runs at rate
// measured (m, named by what): "; a bare producer beside outboxd: p99 7.5 ms",
// or "" for runs without one (results from before the probe).
func (t runs) besideFigure(c string, rate float64, m metric, what string) string {
	v, ok := t.beside(c, rate, m)
	if !ok {
		return ""
	}
	txn := slices.ContainsFunc(t[runKey("live", live250, c, rate)], func(r result) bool { return r.BesideTxn })
	return fmt.Sprintf("; %s beside %s: %s %s", bareProducer(txn), c, what, ms(v))
}

// besideNote is what a live run's note adds about the producer beside it:
// "; beside it a bare producer at 100 records/s: p50 2.1, p99 9.8, max 31.0 ms".
func besideNote(r result) string {
	if r.BesideRate == 0 {
		return ""
	}
	return fmt.Sprintf("; beside it %s at %g records/s: p50 %.1f, p99 %.1f, max %.1f ms", bareProducer(r.BesideTxn), r.BesideRate, r.BesideP50ms, r.BesideP99ms, r.BesideMaxms)
}

// bareProducer names the probe: kafka_raw's producer, or with txn
// kafka_raw_eos's.
func bareProducer(txn bool) string {
	if txn {
		return "a bare transactional producer"
	}
	return "a bare producer"
}
