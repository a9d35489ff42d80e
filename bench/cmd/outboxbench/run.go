package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

type runFlags struct {
	common
	n       int
	size    int
	timeout time.Duration
	settle  time.Duration
	stall   time.Duration
	log     string
	rss     string
	untilEx bool
	// committed: the contender writes in Kafka transactions; the drain ends
	// when the events are visible to a read_committed consumer.
	committed bool
}

func (f *runFlags) parse(name string, args []string, extra func(*flag.FlagSet)) []string {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	f.register(fs)
	fs.IntVar(&f.n, "n", 50000, "events expected")
	fs.IntVar(&f.size, "size", 250, "payload bytes (for the result line)")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Minute, "give up after")
	fs.DurationVar(&f.settle, "settle", 3*time.Second, "wait after the drain before reading slot lag")
	fs.DurationVar(&f.stall, "stall", time.Minute, "once records arrive, give up waiting for the rest after this long without a new one, and count them missing")
	fs.StringVar(&f.log, "log", "", "contender's stdout/stderr file")
	fs.StringVar(&f.rss, "rss", "", "RSS/CPU timeline file (seconds rss_mb cpu_s)")
	if extra != nil {
		extra(fs)
	}
	_ = fs.Parse(args)
	return fs.Args()
}

// cmdCatchup times a contender draining events already in the WAL.
func cmdCatchup(ctx context.Context, args []string) error {
	var f runFlags
	argv := f.parse("catchup", args, func(fs *flag.FlagSet) {
		fs.BoolVar(&f.untilEx, "until-exit", false, "the contender stops by itself (pg_recvlogical --endpos); time it to its exit, no Kafka")
		fs.BoolVar(&f.committed, "read-committed", false, "the contender writes Kafka transactions (outboxd's exactly_once): time the drain until "+
			"the events are visible to a read_committed consumer, and count them as one counts them (the end offsets include the markers)")
	})
	conn, err := connect(ctx, f.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	res := newResult(f.common, "catchup")
	res.Events, res.PayloadBytes = f.n, f.size

	if f.untilEx {
		p, err := startProc(argv, f.log, f.rss)
		if err != nil {
			return err
		}
		ru, err := p.waitExit(f.timeout)
		if err != nil {
			return fmt.Errorf("%w (see %s)", err, f.log)
		}
		end := time.Now()
		res.TotalSec = end.Sub(p.start).Seconds()
		res.Throughput = float64(f.n) / res.TotalSec
		res.WallRate = res.Throughput
		res.usage(ru)
		res.SlotLagBytes, _ = slotLag(ctx, conn, f.slot)
		res.Note = "decode only, output to /dev/null; time includes connection set-up"
		res.print()
		return nil
	}

	w, err := startWatched(ctx, f, argv)
	if err != nil {
		return err
	}
	defer w.cl.Close()
	adm, base, p := w.adm, w.base, w.p
	end, err := waitCount(ctx, adm, f.topics(), base, int64(f.n), f.timeout, f.stall, p.alive)
	stalled := errors.Is(err, errStalled)
	if stalled { // judged on what it delivered: the delivery check counts the rest as missing
		logf("%s: %v", f.label, err)
		err = nil
	}
	var cr *committedReader
	if err == nil && f.committed && !stalled {
		// Every marker takes an offset, so the offsets reach n a little
		// before the events are all in Kafka: only then is a consumer
		// started, so that it does not compete with the contender for the
		// machine, and it reads until n events are visible.
		if cr, err = newCommittedReader(f.brokers, base); err == nil {
			defer cr.close()
			cr.tally = newTally(f.n)
			err = cr.until(ctx, func() bool { return cr.records >= f.n }, p.alive, f.timeout)
		}
	}
	done := p.now()
	if err != nil {
		p.terminate(10 * time.Second)
		return err
	}
	res.CPUSeconds = done.cpuSec
	res.CPUPer100k = done.cpuSec / float64(f.n) * 1e5
	res.PeakRSSMB = p.peakRSSMB()
	res.SteadyRSSMB = float64(done.rssKB) / 1024 // RSS at the end of the drain
	time.Sleep(f.settle)
	res.SlotLagBytes, _ = slotLag(ctx, conn, f.slot)
	p.terminate(20 * time.Second)
	if cr != nil {
		// Whatever the contender committed after the n events are duplicates.
		if end, err = endOffsets(ctx, adm, f.topics()); err != nil {
			return err
		}
		if err := cr.until(ctx, func() bool { return cr.reached(end) }, func() error { return nil }, time.Minute); err != nil {
			return err
		}
		res.Missing, res.Repeated = cr.tally.counts()
		res.Verified = true
		res.Note = deliveryNote(res.Missing, res.Repeated) + "; read_committed: first record appended → last commit marker appended"
		res.fillTimes(p.start, cr.first, cr.last)
		res.print()
		return nil
	}
	// Whatever the contender wrote after the n-th record counts in the
	// delivery check, which reads every record back.
	final, err := endOffsets(ctx, adm, f.topics())
	if err != nil {
		return err
	}
	if res.Missing, res.Repeated, err = verifyCatchup(ctx, f.brokers, base, final, f.n); err != nil {
		return err
	}
	res.Verified = true
	res.Note = deliveryNote(res.Missing, res.Repeated)
	if stalled {
		res.Note += fmt.Sprintf("; stalled: no new record for %s", f.stall)
	}
	first, last, err := appendTimes(ctx, f.brokers, base, end)
	if err != nil {
		return err
	}
	res.fillTimes(p.start, first, last)
	if res.Missing > 0 { // the rate of what it delivered
		res.Throughput *= float64(f.n-res.Missing) / float64(f.n)
	}
	res.print()
	return nil
}

// waitSlotActive waits until the contender has the slot, then warm.
func waitSlotActive(ctx context.Context, conn *pgx.Conn, slot string, p *proc, warm time.Duration) error {
	deadline := time.Now().Add(2 * time.Minute)
	for !slotActive(ctx, conn, slot) {
		if err := p.alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slot %s not active after 2 minutes", slot)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(warm)
	return p.alive()
}

// cmdLive writes 1-row transactions at a fixed rate (0: as fast as the
// writers can) and measures commit → Kafka latency per event.
func cmdLive(ctx context.Context, args []string) error {
	var f runFlags
	var rate float64
	var writers int
	var duration, warmup, warm time.Duration
	var latFile, received, metricsURL, brokerPIDFile string
	var besideRate float64
	var besideTxn bool
	argv := f.parse("live", args, func(fs *flag.FlagSet) {
		fs.Float64Var(&rate, "rate", 1000, "events/s over all writers; 0 = as fast as possible")
		fs.IntVar(&writers, "writers", 8, "concurrent writer connections")
		fs.DurationVar(&duration, "duration", 20*time.Second, "how long to write")
		fs.DurationVar(&warmup, "warmup", 3*time.Second, "latencies of events committed in this first part are not counted")
		fs.DurationVar(&warm, "warm", 2*time.Second, "wait after the contender took the slot before writing")
		fs.StringVar(&latFile, "latencies", "", "also write each measured event's commit time (µs since the writers started) and latency (ms) to this file")
		fs.StringVar(&metricsURL, "metrics", "", "the contender's Prometheus endpoint: report the p99 of outboxd_wal_commit_to_send_seconds over the run")
		fs.StringVar(&brokerPIDFile, "broker-pid-file", "", "the broker's pid file: report its CPU time during the run")
		fs.StringVar(&received, "received", "", "the contender is walread -received FILE: measure commit → receipt from FILE instead of Kafka")
		fs.Float64Var(&besideRate, "beside-rate", 0, "run a bare producer (produce -rate) beside the contender at this many records/s to the topic "+
			besidePrefix("<prefix>")+"_t0-events, which must exist, and report its latency (0: none)")
		fs.BoolVar(&besideTxn, "beside-txn", false, "with -beside-rate: the producer beside commits transactions back to back (produce -rate -txn)")
	})
	conn, err := connect(ctx, f.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	cl, adm, err := newAdmin(f.brokers)
	if err != nil {
		return err
	}
	defer cl.Close()

	p, err := startProc(argv, f.log, f.rss)
	if err != nil {
		return err
	}
	defer p.terminate(20 * time.Second)
	if err := waitSlotActive(ctx, conn, f.slot, p, warm); err != nil {
		return err
	}

	var (
		omu      sync.Mutex
		seen     = map[string]time.Time{} // event id → visible to read_committed, or receipt with -received
		repeated atomic.Int64             // records of an event already seen
	)
	cctx, cancelConsumer := context.WithCancel(ctx)
	defer cancelConsumer()
	var cwg sync.WaitGroup
	if received != "" {
		cwg.Go(func() { tailReceived(cctx, received, &omu, seen) })
	} else if err := consume(cctx, &cwg, f.common, adm, &omu, seen, &repeated); err != nil {
		return err
	}

	// Writers.
	total := int64(rate * duration.Seconds())
	if rate <= 0 {
		total = 1 << 62
	}
	var (
		next     atomic.Int64
		wmu      sync.Mutex
		commits  = map[string]time.Time{}
		werr     atomic.Pointer[error]
		wwg      sync.WaitGroup
		pl       = payload(0, f.size)
		sendHist = scrapeHistogram(metricsURL, commitToSend)
		broker0  = brokerCPU(brokerPIDFile)
		res      = newResult(f.common, "live") // its load and steal cover the run
		cpu0     = p.now().cpuSec
		start    = time.Now()
		stopAt   = start.Add(duration)
		warmedAt = start.Add(warmup)
	)
	var probe *besideProbe
	if besideRate > 0 {
		pctx, cancelProbe := context.WithCancel(ctx) // ends the probe if the run fails
		defer cancelProbe()
		if probe, err = startBeside(pctx, f.common, besideRate, besideTxn, duration, warmup); err != nil {
			return err
		}
	}
	for range writers {
		wc, err := connect(ctx, f.dsn)
		if err != nil {
			return err
		}
		defer wc.Close(ctx)
		wwg.Go(func() {
			local := map[string]time.Time{}
			defer func() {
				wmu.Lock()
				for k, v := range local {
					commits[k] = v
				}
				wmu.Unlock()
			}()
			for {
				k := next.Add(1) - 1
				if k >= total || time.Now().After(stopAt) {
					return
				}
				if rate > 0 {
					due := start.Add(time.Duration(float64(k) / rate * float64(time.Second)))
					if d := time.Until(due); d > 0 {
						time.Sleep(d)
					}
				}
				id := newUUID()
				_, err := wc.Exec(ctx, `INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, 'Created', $4)`,
					id, fmt.Sprintf("%s_t%d", f.prefix, k%int64(f.types)), fmt.Sprintf("agg-%d", (k*7919)%10000), pl)
				if err != nil {
					werr.Store(&err)
					return
				}
				local[id] = time.Now()
			}
		})
	}
	wwg.Wait()
	writeEnd := time.Now()
	if e := werr.Load(); e != nil {
		return fmt.Errorf("writer: %w", *e)
	}
	written := len(commits)
	// Wait for every event to be consumed.
	// A contender that lost events stops adding any: after f.stall without
	// a new one the run is judged on what it delivered.
	deadline := time.Now().Add(f.timeout)
	last, progress := -1, time.Now()
	for {
		omu.Lock()
		n := len(seen)
		omu.Unlock()
		if n >= written {
			break
		}
		if n != last {
			last, progress = n, time.Now()
		}
		if err := p.alive(); err != nil {
			return err
		}
		if f.stall > 0 && time.Since(progress) > f.stall {
			logf("%s: %d of %d events, no new one for %s", f.label, n, written, f.stall)
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d events reached Kafka after %s", n, written, f.timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	done := p.now()
	if b0, b1 := broker0, brokerCPU(brokerPIDFile); b0 >= 0 && b1 >= 0 {
		d := b1 - b0
		res.BrokerCPUSec = &d
	}
	if metricsURL != "" {
		if h := scrapeHistogram(metricsURL, commitToSend); h != nil && sendHist != nil {
			q := h.minus(sendHist).quantile(0.99) * 1000
			res.PGSendP99ms = &q
		}
	}
	cancelConsumer()
	cwg.Wait()

	var events []eventLatency
	missing := 0
	drained := writeEnd // when the last event was in Kafka, if after the writers stopped
	for id, ct := range commits {
		at, ok := seen[id]
		if !ok {
			missing++
			continue
		}
		if at.After(drained) {
			drained = at
		}
		if !ct.Before(warmedAt) {
			events = append(events, eventLatency{ct.Sub(start), at.Sub(ct)})
		}
	}
	if latFile != "" {
		if err := writeLatencies(latFile, events); err != nil {
			return err
		}
	}
	lat := make([]float64, len(events))
	for i, e := range events {
		lat[i] = float64(e.lat.Microseconds()) / 1000
	}
	slices.Sort(lat)
	res.Events, res.PayloadBytes, res.TargetRate = written, f.size, rate
	res.WriteRate = float64(written) / writeEnd.Sub(start).Seconds()
	res.Throughput = float64(written) / drained.Sub(start).Seconds()
	res.P50ms, res.P99ms, res.P999ms = percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 0.999)
	if len(lat) > 0 {
		res.Maxms = lat[len(lat)-1]
	}
	res.CPUSeconds = done.cpuSec - cpu0
	res.CPUPer100k = res.CPUSeconds / float64(written) * 1e5
	res.PeakRSSMB = p.peakRSSMB()
	res.SteadyRSSMB = p.medianRSSMB(warmedAt, writeEnd)
	time.Sleep(f.settle)
	res.SlotLagBytes, _ = slotLag(ctx, conn, f.slot)
	drain := drained.Sub(writeEnd).Seconds()
	res.DrainSec = &drain
	res.Note = fmt.Sprintf("%d writers, %d events measured after %s warm-up, drained %.2fs after writers stopped",
		writers, len(lat), warmup, drain)
	if received != "" {
		res.Note += "; commit → receipt of the commit message by a bare slot reader (no Kafka)"
	}
	if probe != nil {
		if err := probe.wait(res); err != nil {
			logf("%v; the run is reported without its floor", err)
		}
	}
	res.Missing, res.Repeated = missing, int(repeated.Load())
	res.Verified = received == "" // a bare slot reader writes no Kafka records
	if res.Verified {
		res.Note += "; " + deliveryNote(res.Missing, res.Repeated)
	}
	res.print()
	return nil
}

// consume reads every record the contender appends from the current end of
// the run's topics, noting in seen when each event id became visible to a
// read_committed consumer.
func consume(ctx context.Context, wg *sync.WaitGroup, c common, adm *kadm.Client, mu *sync.Mutex, seen map[string]time.Time, repeated *atomic.Int64) error {
	base, err := endOffsets(ctx, adm, c.topics())
	if err != nil {
		return err
	}
	parts := map[string]map[int32]kgo.Offset{}
	for t, ps := range base {
		parts[t] = map[int32]kgo.Offset{}
		for pt, off := range ps {
			parts[t][pt] = kgo.NewOffset().At(off)
		}
	}
	// The latency comes from each record's LogAppendTime, so the consumer
	// need not see records early, and it must not load the machine under
	// test: it asks for 1 MiB or 100 ms per fetch. Fetching eagerly (any
	// byte at once) sent the broker a fetch request every few records on
	// the same two cores, and raised outboxd's p99 at 5k ev/s from 1.4–10 ms
	// to 12–24 ms (three runs each, alternating).
	// It reads as a read_committed consumer and notes when each event became
	// visible to one: for records in Kafka transactions (outboxd's
	// exactly_once) the append time of their commit marker, for any other
	// record its own append time.
	consumer, err := kgo.NewClient(append(readCommittedOpts(), kgo.SeedBrokers(c.brokers), kgo.ConsumePartitions(parts),
		kgo.FetchMinBytes(1<<20), kgo.FetchMaxWait(100*time.Millisecond))...)
	if err != nil {
		return err
	}
	wg.Go(func() {
		defer consumer.Close()
		var vis visibility
		for ctx.Err() == nil {
			fetches := consumer.PollFetches(ctx)
			mu.Lock()
			fetches.EachRecord(func(r *kgo.Record) {
				vis.add(r, func(r *kgo.Record, at time.Time) {
					id, ok := idOf(r)
					if !ok {
						repeated.Add(1) // not one of the writers' events
						return
					}
					if _, dup := seen[id]; dup {
						repeated.Add(1)
						return // the first copy's time counts
					}
					seen[id] = at
				})
			})
			mu.Unlock()
		}
	})
	return nil
}

// tailReceived follows the file walread -received writes ("<id> <unix ns>"
// lines) until ctx ends, noting each id's receipt time in seen.
func tailReceived(ctx context.Context, path string, mu *sync.Mutex, seen map[string]time.Time) {
	var f *os.File
	for f == nil {
		var err error
		if f, err = os.Open(path); err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var partial string
	for {
		line, err := r.ReadString('\n')
		if err != nil { // EOF: the writer flushes every 20 ms
			partial += line
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		line, partial = partial+line, ""
		id, ns, ok := strings.Cut(strings.TrimSpace(line), " ")
		n, perr := strconv.ParseInt(ns, 10, 64)
		if !ok || perr != nil {
			continue
		}
		mu.Lock()
		seen[id] = time.Unix(0, n)
		mu.Unlock()
	}
}

// cmdIdle keeps the outbox idle while another table is written, then reads slot lag.
func cmdIdle(ctx context.Context, args []string) error {
	var f runFlags
	var duration time.Duration
	var rate float64
	argv := f.parse("idle", args, func(fs *flag.FlagSet) {
		fs.DurationVar(&duration, "duration", 60*time.Second, "how long to write to the other table")
		fs.Float64Var(&rate, "rate", 100, "1-row transactions per second on the other table")
	})
	conn, err := connect(ctx, f.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	p, err := startProc(argv, f.log, f.rss)
	if err != nil {
		return err
	}
	defer p.terminate(20 * time.Second)
	if err := waitSlotActive(ctx, conn, f.slot, p, 2*time.Second); err != nil {
		return err
	}
	wc, err := connect(ctx, f.dsn)
	if err != nil {
		return err
	}
	defer wc.Close(ctx)
	res := newResult(f.common, "idle")
	cpu0 := p.now().cpuSec
	start := time.Now()
	var walBytes int64
	var lsn0 string
	_ = conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn0)
	for k := 0; time.Since(start) < duration; k++ {
		due := start.Add(time.Duration(float64(k) / rate * float64(time.Second)))
		time.Sleep(time.Until(due))
		if _, err := wc.Exec(ctx, `INSERT INTO public.bench_other (v) VALUES ($1)`, "x"); err != nil {
			return fmt.Errorf("writing other table: %w", err)
		}
	}
	_ = conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, lsn0).Scan(&walBytes)
	res.SlotLagBytes, _ = slotLag(ctx, conn, f.slot)
	res.CPUSeconds = p.now().cpuSec - cpu0
	res.PeakRSSMB = p.peakRSSMB()
	res.SteadyRSSMB = p.medianRSSMB(start, time.Now())
	res.Note = fmt.Sprintf("%.0f s of %.0f tx/s to another table wrote %d WAL bytes", duration.Seconds(), rate, walBytes)
	res.print()
	return nil
}

// eventLatency is one measured event: when it committed (since the writers
// started) and its commit → append latency.
type eventLatency struct{ at, lat time.Duration }

// writeLatencies writes "commit_us latency_ms" per event, in commit order.
func writeLatencies(path string, events []eventLatency) error {
	slices.SortFunc(events, func(a, b eventLatency) int { return cmp.Compare(a.at, b.at) })
	var b strings.Builder
	for _, e := range events {
		fmt.Fprintf(&b, "%d %.3f\n", e.at.Microseconds(), float64(e.lat.Microseconds())/1000)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// commitToSend is outboxd's histogram of Postgres' share of the latency.
const commitToSend = "outboxd_wal_commit_to_send_seconds"

// histogram is a Prometheus histogram's cumulative bucket counts by upper bound.
type histogram map[float64]float64

// scrapeHistogram reads histogram name from a Prometheus text endpoint; nil
// when url is empty or the scrape fails.
func scrapeHistogram(url, name string) histogram {
	if url == "" {
		return nil
	}
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		logf("scraping %s: %v", url, err)
		return nil
	}
	defer resp.Body.Close()
	h := histogram{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	prefix := name + `_bucket{le="`
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		le, n, ok := strings.Cut(line, `"} `)
		if !ok {
			continue
		}
		ub, err1 := strconv.ParseFloat(le, 64) // "+Inf" parses too
		v, err2 := strconv.ParseFloat(n, 64)
		if err1 == nil && err2 == nil {
			h[ub] = v
		}
	}
	if len(h) == 0 {
		logf("%s has no %s", url, name)
		return nil
	}
	return h
}

func (h histogram) minus(o histogram) histogram {
	d := histogram{}
	for ub, v := range h {
		d[ub] = v - o[ub]
	}
	return d
}

// quantile interpolates linearly within the bucket that holds q, like
// Prometheus' histogram_quantile; in the +Inf bucket it returns the highest
// finite bound.
func (h histogram) quantile(q float64) float64 {
	ubs := slices.Sorted(maps.Keys(h))
	total := h[math.Inf(1)]
	if total <= 0 {
		return 0
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, ub := range ubs {
		if h[ub] >= rank {
			if math.IsInf(ub, 1) {
				return lower
			}
			return lower + (ub-lower)*(rank-below)/(h[ub]-below)
		}
		lower, below = ub, h[ub]
	}
	return lower
}

// brokerCPU reads the CPU seconds of the process a pid file names; -1 when
// path is empty or the process cannot be read.
func brokerCPU(path string) float64 {
	if path == "" {
		return -1
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	cpu, err := procCPU(pid)
	if err != nil {
		return -1
	}
	return cpu
}
