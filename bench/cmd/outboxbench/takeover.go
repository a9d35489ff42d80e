package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The takeover sections (issue 35, acceptance 2): what taking over an
// outbox a team already has costs.
//
//   - backfill: rows already in the table before any slot exists, delivered
//     by outboxd's postgres.backfill (outboxd_backfill), against the time
//     Postgres takes to COPY the same rows, in the same order, to nothing
//     (pg_copy, the limit), and against outboxd's catch-up of the same rows
//     from a slot made before they were written (outboxd).
//   - multitable: the cost of decoding beside a busy table that is not an
//     outbox. outboxd's several tables are a publication that lists them
//     (FOR TABLE); the alternative issue 35 named is a FOR ALL TABLES
//     publication that outboxd filters (outboxd_alltables). One fill of
//     events alone, and one of events with as many rows of another table in
//     the same transactions, drained by each.
//   - replay: outboxd's live run at 1k events/s, alone and beside an
//     `outboxd replay` at its default rate.

// Workloads of the takeover sections (the results' workload field).
const (
	backfillWorkload  = "backfill"
	multitableAlone   = "multitable-alone" // outbox events only
	multitableBusy    = "multitable-busy"  // with as many rows of a non-outbox table in the same transactions
	replayLiveAlone   = "live-250B-no-replay"
	replayLiveBeside  = "live-250B-replay"
	replayWorkload    = "replay-beside-live"
	replayPrefix      = "replay"
	allTablesPub      = "bench_all"
	replayLiveRate    = 1000   // the live section's 1k ev/s, and outboxd replay's default -rate
	replayOverlapSecs = 8      // the replay's rows cover the live run and this much more, at its rate
	multitableMax     = 250000 // the multitable section's events: the size's catch-up events, at most this many
)

// backfillCopy is the backfill's limit: Postgres reading the same rows in
// the backfill's order (order_by created_at, then the primary key).
const backfillCopy = "COPY (SELECT * FROM public.outbox WHERE true ORDER BY created_at, id) TO STDOUT"

// takeoverOutboxd tells whether c is one of the takeover sections' outboxd
// contenders.
func takeoverOutboxd(c string) bool { return c == "outboxd_backfill" || c == "outboxd_alltables" }

// takeoverEnv is what a takeover contender's environment adds to outboxd's.
func takeoverEnv(c string) string {
	if c == "outboxd_backfill" { // every row of the table, before the slot it creates streams
		return "OUTBOXD_POSTGRES_CREATE_SLOT=true OUTBOXD_POSTGRES_BACKFILL_WHERE=true "
	}
	return ""
}

// publicationOf is the publication contender c reads.
func publicationOf(c string) string {
	if strings.HasSuffix(c, "_alltables") {
		return allTablesPub
	}
	return "bench"
}

// takeoverSection runs one of the takeover sections.
func (p *plan) takeoverSection(ctx context.Context, section string) {
	if !p.has("outboxd") {
		p.log("%s: measures outboxd, which is not among the contenders; skipped", section)
		return
	}
	switch section {
	case "backfill":
		p.backfillSection(ctx)
	case "multitable":
		p.multitableSection(ctx)
	case "replay":
		p.replaySection(ctx)
	}
}

// backfillSection fills the table once, every row kept, with the slot
// catch-up's slots made before the fill and none for the backfill; then
// each repeat runs the COPY, the backfill (outboxd creates its slot, after
// the fill) and the slot catch-up, each repeat starting with the next.
func (p *plan) backfillSection(ctx context.Context) {
	w := workload{name: backfillWorkload, n: p.backfillN, tx: 100, size: 250}
	prefix := notName.ReplaceAllString(w.name, "_")
	p.log("backfill: %d rows in the table before outboxd's slot exists, 100 rows/tx, 250 B", w.n)
	p.topics(ctx, prefix)
	if err := p.sql(ctx, "TRUNCATE public.outbox"); err != nil {
		p.log("  %v", err)
		return
	}
	for rep := 1; rep <= p.catchupRepeat; rep++ {
		p.slot(ctx, catchupSlot(prefix, "outboxd", rep), false)
	}
	var lsn strings.Builder
	if err := p.sub(ctx, &lsn, "fill", "-dsn", p.dsn, "-prefix", prefix, "-n", strconv.Itoa(w.n), "-tx", strconv.Itoa(w.tx),
		"-size", strconv.Itoa(w.size), "-keep"); err != nil {
		p.log("  fill failed: %v", err)
		return
	}
	endLSN := strings.TrimSpace(lsn.String())
	runs := []string{"pg_copy", "outboxd_backfill", "outboxd"}
	for rep := 1; rep <= p.catchupRepeat; rep++ {
		k := (rep - 1) % len(runs)
		for _, c := range append(append([]string{}, runs[k:]...), runs[:k]...) {
			p.quiesce(ctx)
			slot := catchupSlot(prefix, c, rep)
			switch c {
			case "pg_copy":
				p.log("  pg_copy")
				p.result(ctx, c, "", "copy", "-label", c, "-workload", w.name, "-n", strconv.Itoa(w.n), "-size", strconv.Itoa(w.size),
					"-query", backfillCopy)
			case "outboxd_backfill":
				p.slot(ctx, slot, true) // outboxd creates it, with its snapshot
				p.catchupRun(ctx, w, endLSN, c, slot)
				// Its state: the next repeat's backfill starts as the first did.
				if err := p.sql(ctx, "DROP TABLE IF EXISTS public.outboxd_backfill"); err != nil {
					p.log("  %v", err)
				}
			default:
				p.catchupRun(ctx, w, endLSN, c, slot)
			}
		}
	}
	if err := p.sql(ctx, "TRUNCATE public.outbox"); err != nil {
		p.log("  %v", err)
	}
	p.untopics(ctx, prefix)
	if err := p.sql(ctx, "CHECKPOINT"); err != nil {
		p.log("  %v", err)
	}
}

// multitableSection drains one fill of events alone and one of events with
// a busy non-outbox table beside them, through the publication outboxd
// uses (bench, FOR TABLE public.outbox) and, for the second, through a FOR
// ALL TABLES publication too; pg_recvlogical reads each as the decoding
// alone.
func (p *plan) multitableSection(ctx context.Context) {
	p.log("multitable: events alone, then beside as many rows of a non-outbox table; FOR TABLE and FOR ALL TABLES publications")
	if err := p.sql(ctx, "DROP PUBLICATION IF EXISTS "+allTablesPub+"; CREATE PUBLICATION "+allTablesPub+
		" FOR ALL TABLES WITH (publish = 'insert, update')"); err != nil {
		p.log("  %v", err)
		return
	}
	alone, busy := []string{"outboxd"}, []string{"outboxd", "outboxd_alltables"}
	if p.has("pg_recvlogical") {
		alone = append([]string{"pg_recvlogical"}, alone...)
		busy = append([]string{"pg_recvlogical", "pg_recvlogical_alltables"}, busy...)
	}
	n := min(p.n, multitableMax)
	p.catchupWorkload(ctx, workload{name: multitableAlone, n: n, tx: 100, size: 250}, alone)
	p.catchupWorkload(ctx, workload{name: multitableBusy, n: n, tx: 100, size: 250, fillExtra: []string{"-other"}}, busy)
	if err := p.sql(ctx, "DROP PUBLICATION "+allTablesPub); err != nil {
		p.log("  %v", err)
	}
}

// replaySection runs outboxd's live run at 1k events/s with the table
// holding the replay's rows, alone and beside `outboxd replay` of them,
// repeats alternating. The rows are written before the live slot exists,
// so that live delivery does not send them; the replay reads them through
// an index on created_at, its order column, as docs/replay.md advises.
func (p *plan) replaySection(ctx context.Context) {
	m := replayLiveRate * (p.liveS + replayOverlapSecs)
	p.log("replay: outboxd live at %d ev/s, alone and beside outboxd replay of %d rows at its default rate", replayLiveRate, m)
	if err := p.sql(ctx, "CREATE INDEX IF NOT EXISTS bench_outbox_created_at ON public.outbox (created_at)"); err != nil {
		p.log("  %v", err)
		return
	}
	p.topics(ctx, replayPrefix)
	fill := func(ctx context.Context) {
		if err := p.sub(ctx, io.Discard, "fill", "-dsn", p.dsn, "-prefix", replayPrefix, "-n", strconv.Itoa(m), "-tx", "100",
			"-size", "250", "-keep"); err != nil {
			p.log("  fill failed: %v", err)
		}
		p.quiesce(ctx)
	}
	// The live section warms the broker's paths up with a run of its own;
	// without it, so does this section.
	if !slices.Contains(p.sections, "live") {
		p.log("live warm-up: outboxd, not recorded")
		p.liveRunWith(ctx, "outboxd", replayLiveRate, "warm", true, liveAround{workload: replayLiveAlone, before: fill})
	}
	for rep := 1; rep <= p.liveRepeat; rep++ {
		order := []bool{false, true}
		if rep%2 == 0 {
			order = []bool{true, false}
		}
		for _, beside := range order {
			around := liveAround{workload: replayLiveAlone, before: fill}
			if beside {
				around.workload, around.beside = replayLiveBeside, p.replayBeside(m, rep)
			}
			p.liveRunWith(ctx, "outboxd", replayLiveRate, strconv.Itoa(rep), false, around)
		}
	}
	for _, q := range []string{"TRUNCATE public.outbox", "DROP INDEX IF EXISTS public.bench_outbox_created_at", "DROP TABLE IF EXISTS public.outboxd_replay"} {
		if err := p.sql(ctx, q); err != nil {
			p.log("  %v", err)
		}
	}
	p.untopics(ctx, replayPrefix)
}

// replayBeside starts `outboxd replay` of the m replay rows, at its default
// rate, as the replay subcommand of this binary, which times it and checks
// its records; the function it returns waits for it.
func (p *plan) replayBeside(m, rep int) func(ctx context.Context) func() {
	return func(ctx context.Context) func() {
		logPath := filepath.Join(p.dir, "runs", fmt.Sprintf("bench_replay_%d.log", rep))
		argv := append(p.outboxdCmd("outboxd", "bench_replay"), "replay", "-where", "aggregate_type LIKE '"+replayPrefix+"%'")
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.result(ctx, "outboxd_replay", logPath, append([]string{"replay", "-prefix", replayPrefix, "-label", "outboxd_replay",
				"-workload", replayWorkload, "-n", strconv.Itoa(m), "-size", "250", "-log", logPath, "--"}, argv...)...)
		}()
		return func() { <-done }
	}
}

// cmdCopy times a COPY … TO STDOUT read to nothing: the limit of the
// backfill, Postgres reading and sending the rows with nothing done with
// them. CPU is the backend's.
func cmdCopy(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("copy", flag.ExitOnError)
	c.register(fs)
	n := fs.Int("n", 0, "rows expected")
	size := fs.Int("size", 250, "payload bytes (for the result line)")
	query := fs.String("query", backfillCopy, "the COPY … TO STDOUT statement")
	_ = fs.Parse(args)
	conn, err := connect(ctx, c.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return err
	}
	res := newResult(c, "catchup")
	cpu0, cpuErr := procCPU(pid)
	start := time.Now()
	tag, err := conn.PgConn().CopyTo(ctx, io.Discard, *query)
	if err != nil {
		return fmt.Errorf("%s: %w", *query, err)
	}
	res.TotalSec = time.Since(start).Seconds()
	if cpu1, err := procCPU(pid); err == nil && cpuErr == nil {
		res.CPUSeconds = cpu1 - cpu0
	}
	rows := int(tag.RowsAffected())
	if *n > 0 && rows != *n {
		return fmt.Errorf("%s read %d rows, not the %d expected", *query, rows, *n)
	}
	res.Events, res.PayloadBytes = rows, *size
	res.Throughput = float64(rows) / res.TotalSec
	res.WallRate = res.Throughput
	res.CPUPer100k = res.CPUSeconds / float64(max(rows, 1)) * 1e5
	res.Note = "the limit: " + *query + ", read to nothing (no Kafka); CPU is the backend's"
	res.print()
	return nil
}

// cmdReplay runs `outboxd replay` (the command after --) until it exits by
// itself, and checks what it sent: every row of the fill once, by seq, in
// the run's topics. Rows/s from its first to its last record appended.
func cmdReplay(ctx context.Context, args []string) error {
	var f runFlags
	argv := f.parse("replay", args, nil)
	res := newResult(f.common, "catchup")
	res.Events, res.PayloadBytes = f.n, f.size
	w, err := startWatched(ctx, f, argv)
	if err != nil {
		return err
	}
	defer w.cl.Close()
	ru, err := w.p.waitExit(f.timeout)
	if err != nil {
		return fmt.Errorf("%w (see %s)", err, f.log)
	}
	res.usage(ru)
	base, p := w.base, w.p
	end, err := endOffsets(ctx, w.adm, f.topics())
	if err != nil {
		return err
	}
	if res.Missing, res.Repeated, err = verifyCatchup(ctx, f.brokers, base, end, f.n); err != nil {
		return err
	}
	res.Verified = true
	first, last, err := appendTimes(ctx, f.brokers, base, end)
	if err != nil {
		return err
	}
	res.fillTimes(p.start, first, last)
	res.Note = deliveryNote(res.Missing, res.Repeated) + "; outboxd replay at its default -rate beside outboxd's live run"
	res.print()
	return nil
}

// watched is a contender started against Kafka: the admin client of its
// run's topics (the caller closes cl), their end offsets before it started,
// and its process.
type watched struct {
	cl   *kgo.Client
	adm  *kadm.Client
	base offsets
	p    *proc
}

// startWatched notes the end offsets of the run's topics, then starts the
// contender.
func startWatched(ctx context.Context, f runFlags, argv []string) (watched, error) {
	cl, adm, err := newAdmin(f.brokers)
	if err != nil {
		return watched{}, err
	}
	w := watched{cl: cl, adm: adm}
	if w.base, err = endOffsets(ctx, adm, f.topics()); err == nil {
		w.p, err = startProc(argv, f.log, f.rss)
	}
	if err != nil {
		cl.Close()
		return watched{}, err
	}
	return w, nil
}

// usage fills the CPU and peak RSS of a contender that exited from its
// resource usage.
func (r *result) usage(ru *syscall.Rusage) {
	r.CPUSeconds = tv(ru.Utime) + tv(ru.Stime)
	r.CPUPer100k = r.CPUSeconds / float64(max(r.Events, 1)) * 1e5
	r.PeakRSSMB = float64(ru.Maxrss) / 1024
}

// waitExit waits up to timeout for a contender that stops by itself, and
// returns its resource usage; it fails when the contender failed or ran on.
func (p *proc) waitExit(timeout time.Duration) (*syscall.Rusage, error) {
	select {
	case <-p.exited:
	case <-time.After(timeout):
		p.terminate(time.Second)
		return nil, fmt.Errorf("contender still running after %s", timeout)
	}
	if p.exitErr != nil {
		return nil, fmt.Errorf("contender failed: %v", p.exitErr)
	}
	return p.cmd.ProcessState.SysUsage().(*syscall.Rusage), nil
}
