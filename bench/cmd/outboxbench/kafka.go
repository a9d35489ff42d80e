package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

func newAdmin(brokers string) (*kgo.Client, *kadm.Client, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		return nil, nil, err
	}
	return cl, kadm.NewClient(cl), nil
}

// adminAt opens an admin client and reads the end offsets of c's topics
// before a run; the caller closes cl.
func adminAt(ctx context.Context, c common) (cl *kgo.Client, adm *kadm.Client, base offsets, err error) {
	cl, adm, err = newAdmin(c.brokers)
	if err != nil {
		return nil, nil, nil, err
	}
	if base, err = endOffsets(ctx, adm, c.topics()); err != nil {
		cl.Close()
		return nil, nil, nil, err
	}
	return cl, adm, base, nil
}

func cmdTopics(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("topics", flag.ExitOnError)
	c.register(fs)
	partitions := fs.Int("partitions", 6, "partitions per topic")
	del := fs.Bool("delete", false, "delete the prefix's topics instead of creating them")
	maxMessage := fs.Int("max-message-bytes", 0, "the topics' max.message.bytes (0: the broker's default)")
	warm := fs.Bool("warm", false, "write past index.interval.bytes into every new partition, so that the broker writes its first index entries now, not in the run")
	_ = fs.Parse(args)
	cl, adm, err := newAdmin(c.brokers)
	if err != nil {
		return err
	}
	defer cl.Close()
	if *del {
		// So that every run meets a broker of the same size: partitions
		// left behind add to its state and may lengthen its collections.
		for chunk := range slices.Chunk(c.topics(), 100) { // the cost section's 1,000 topics, a request at a time
			resp, err := adm.DeleteTopics(ctx, chunk...)
			if err != nil {
				return fmt.Errorf("deleting topics: %w", err)
			}
			for _, r := range resp {
				if r.Err != nil && !errors.Is(r.Err, kerr.UnknownTopicOrPartition) {
					return fmt.Errorf("deleting topic %s: %w", r.Topic, r.Err)
				}
			}
		}
		return nil
	}
	cfg := map[string]*string{"message.timestamp.type": new("LogAppendTime")}
	if *maxMessage > 0 {
		cfg["max.message.bytes"] = new(strconv.Itoa(*maxMessage))
	}
	for chunk := range slices.Chunk(c.topics(), 100) {
		resp, err := adm.CreateTopics(ctx, int32(*partitions), 1, cfg, chunk...)
		if err != nil {
			return fmt.Errorf("creating topics: %w", err)
		}
		for _, r := range resp {
			if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
				return fmt.Errorf("creating topic %s: %w", r.Topic, r.Err)
			}
		}
	}
	// Wait for leaders so that nobody's first records hit an unknown topic.
	wait := 30*time.Second + time.Duration(c.types)*100*time.Millisecond
	deadline := time.Now().Add(wait)
	for {
		td, err := adm.ListTopics(ctx, c.topics()...)
		ok := err == nil
		for _, t := range c.topics() {
			d, found := td[t]
			if !found || d.Err != nil || len(d.Partitions) != *partitions {
				ok = false
				break
			}
			for _, p := range d.Partitions {
				if p.Leader < 0 {
					ok = false
				}
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topics have no leaders after %s", wait)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if *warm {
		return warmPartitions(ctx, c.brokers, c.topics(), int32(*partitions))
	}
	return nil
}

// warmPartitions writes 5 KB and then one small record into every
// partition of topics. The broker writes a partition's first offset and
// time index entries with the first batch after its log passed
// index.interval.bytes (4 KB; it checks before it appends): in fresh
// topics that was a live run's first produce past 4 KB, and the 60 new
// partitions' first entries stalled its appends for 0.5–3 s, about 0.5 s
// after the writers started, a tail reaching past the run's 3 s warm-up.
// Written here, before the run, it is outside it. The records carry no
// event id, and every reader of a run starts at the end offsets taken
// after them.
func warmPartitions(ctx context.Context, brokers string, topics []string, partitions int32) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		return err
	}
	defer cl.Close()
	for _, value := range [][]byte{make([]byte, 5<<10), []byte("warm")} { // two batches: past 4 KB, then the one that writes the entries
		var recs []*kgo.Record
		for _, t := range topics {
			for p := range partitions {
				recs = append(recs, &kgo.Record{Topic: t, Partition: p, Value: value})
			}
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return fmt.Errorf("warming the partitions of %s…: %w", topics[0], err)
		}
	}
	return nil
}

// offsets are end offsets of the run's topics.
type offsets map[string]map[int32]int64

func endOffsets(ctx context.Context, adm *kadm.Client, topics []string) (offsets, error) {
	lo, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, err
	}
	out := offsets{}
	var lerr error
	lo.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			lerr = o.Err
			return
		}
		if out[o.Topic] == nil {
			out[o.Topic] = map[int32]int64{}
		}
		out[o.Topic][o.Partition] = o.Offset
	})
	return out, lerr
}

func (o offsets) sum() int64 {
	var s int64
	for _, ps := range o {
		for _, v := range ps {
			s += v
		}
	}
	return s
}

// appendTimes returns the earliest append time of the records after base and
// the latest append time of the records before end (the topics use
// LogAppendTime, so this is when the broker appended them).
func appendTimes(ctx context.Context, brokers string, base, end offsets) (first, last time.Time, err error) {
	read := func(at func(t string, p int32) (int64, bool)) ([]time.Time, error) {
		parts := map[string]map[int32]kgo.Offset{}
		want := 0
		for t, ps := range end {
			for p := range ps {
				if off, ok := at(t, p); ok {
					if parts[t] == nil {
						parts[t] = map[int32]kgo.Offset{}
					}
					parts[t][p] = kgo.NewOffset().At(off)
					want++
				}
			}
		}
		if want == 0 {
			return nil, nil
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumePartitions(parts), kgo.FetchMaxPartitionBytes(1<<16))
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		got := map[string]map[int32]bool{}
		var ts []time.Time
		for len(ts) < want {
			fetches := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return nil, fmt.Errorf("reading append times: %w", ctx.Err())
			}
			fetches.EachRecord(func(r *kgo.Record) {
				if got[r.Topic] == nil {
					got[r.Topic] = map[int32]bool{}
				}
				if !got[r.Topic][r.Partition] && r.Offset == parts[r.Topic][r.Partition].EpochOffset().Offset {
					got[r.Topic][r.Partition] = true
					ts = append(ts, r.Timestamp)
				}
			})
		}
		return ts, nil
	}
	firsts, err := read(func(t string, p int32) (int64, bool) {
		b := base[t][p]
		return b, end[t][p] > b
	})
	if err != nil {
		return first, last, err
	}
	lasts, err := read(func(t string, p int32) (int64, bool) {
		return end[t][p] - 1, end[t][p] > base[t][p]
	})
	if err != nil {
		return first, last, err
	}
	for _, t := range firsts {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	for _, t := range lasts {
		if t.After(last) {
			last = t
		}
	}
	return first, last, nil
}

// errStalled says that a contender stopped adding records before n: the
// run is then judged on what it delivered (its missing events counted),
// rather than failed after the whole timeout.
var errStalled = errors.New("no new record")

// waitCount polls end offsets until n records were added after base. Once
// records arrive, stall without a new one ends the wait with errStalled.
func waitCount(ctx context.Context, adm *kadm.Client, topics []string, base offsets, n int64, timeout, stall time.Duration, alive func() error) (offsets, error) {
	deadline := time.Now().Add(timeout)
	want := base.sum() + n
	var last int64 = -1
	progress := time.Now()
	for {
		end, err := endOffsets(ctx, adm, topics)
		if err == nil && end.sum() >= want {
			return end, nil
		}
		if err == nil && end.sum() != last {
			last, progress = end.sum(), time.Now()
		}
		if err := alive(); err != nil {
			return end, err
		}
		if err == nil && stall > 0 && last > base.sum() && time.Since(progress) > stall {
			return end, fmt.Errorf("%d of %d records, %w for %s", last-base.sum(), n, errStalled, stall)
		}
		if time.Now().After(deadline) {
			return end, fmt.Errorf("only %d of %d records after %s", end.sum()-base.sum(), n, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cmdProduce measures Kafka's raw produce rate for records shaped like the
// outbox events: same topics, keys, value sizes and headers.
func cmdProduce(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("produce", flag.ExitOnError)
	c.register(fs)
	n := fs.Int("n", 50000, "records")
	size := fs.Int("size", 250, "approximate value bytes")
	rate := fs.Float64("rate", 0, "records/s, paced, reporting send → ack latency (0: -n records as fast as possible)")
	duration := fs.Duration("duration", 15*time.Second, "how long to send at -rate")
	warmup := fs.Duration("warmup", 3*time.Second, "latencies of records sent in this first part of a -rate run are not counted")
	txn := fs.Bool("txn", false, "with -rate: send in Kafka transactions, each committed as soon as the previous commit returns, and report send → commit (the floor of exactly-once latency)")
	_ = fs.Parse(args)
	if *rate > 0 && *txn {
		return produceTxnPaced(ctx, c, *size, *rate, *duration, *warmup)
	}
	if *rate > 0 {
		return producePaced(ctx, c, *size, *rate, *duration, *warmup)
	}

	// Build the records first, so that only producing is timed.
	pool := payloads(*size)
	recs := make([]*kgo.Record, *n)
	for g := range recs {
		recs[g] = eventRecord(c, g, pool)
	}
	cl, adm, base, err := adminAt(ctx, c)
	if err != nil {
		return err
	}
	defer cl.Close()
	p, err := rawProducer(c)
	if err != nil {
		return err
	}
	res := newResult(c, "catchup") // its load and steal cover the run
	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	wg.Add(len(recs))
	for _, r := range recs {
		p.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Store(&err)
			}
			wg.Done()
		})
	}
	wg.Wait()
	done := time.Now()
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	p.Close()
	if e := failed.Load(); e != nil {
		return fmt.Errorf("producing: %w", *e)
	}
	end, err := endOffsets(ctx, adm, c.topics())
	if err != nil {
		return err
	}
	first, last, err := appendTimes(ctx, c.brokers, base, end)
	if err != nil {
		return err
	}
	cpu := tv(ru1.Utime) + tv(ru1.Stime) - tv(ru0.Utime) - tv(ru0.Stime)
	res.Events = *n
	res.PayloadBytes = *size
	res.fillTimes(start, first, last)
	res.CPUSeconds = cpu
	res.CPUPer100k = cpu / float64(*n) * 1e5
	res.Note = fmt.Sprintf("acks received %.3fs after start", done.Sub(start).Seconds())
	res.print()
	return nil
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// payloads returns 1,024 distinct values of about size bytes.
func payloads(size int) [][]byte {
	pool := make([][]byte, 1024)
	for i := range pool {
		pool[i] = []byte(payload(i, size))
	}
	return pool
}

// eventRecord is the g-th record shaped like an outbox event: same topics,
// keys and headers as the events outboxd produces.
func eventRecord(c common, g int, pool [][]byte) *kgo.Record {
	return &kgo.Record{
		Topic: fmt.Sprintf("%s_t%d-events", c.prefix, g%c.types),
		Key:   fmt.Appendf(nil, "agg-%d", (g*7919)%10000),
		Value: pool[g%len(pool)],
		Headers: []kgo.RecordHeader{
			{Key: "id", Value: []byte(newUUID())},
			{Key: "eventType", Value: []byte("Created")},
		},
	}
}

// rawProducer is a plain franz-go producer with its defaults (idempotent,
// linger 10 ms, 10,000 buffered records), acks=all, and the Java-compatible
// murmur2 key partitioner outboxd uses, plus opts.
func rawProducer(c common, opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.brokers), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil))}, opts...)...)
}

// producePaced sends records shaped like the outbox events at a fixed rate,
// one at a time as a live relay would, and reports the send → ack latency:
// the floor of commit → Kafka latency that the broker allows.
func producePaced(ctx context.Context, c common, size int, rate float64, duration, warmup time.Duration) error {
	pool := payloads(size)
	p, err := rawProducer(c, kgo.ProducerLinger(0)) // send at once: the floor (outboxd lingers 1 ms by default)
	if err != nil {
		return err
	}
	defer p.Close()
	res := newResult(c, "live") // its load and steal cover the run
	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	var (
		mu  sync.Mutex
		lat []float64
		wg  sync.WaitGroup
	)
	var failed atomic.Pointer[error]
	start := time.Now()
	n := int(rate * duration.Seconds())
	for g := range n {
		at := start.Add(time.Duration(float64(g) / rate * float64(time.Second)))
		time.Sleep(time.Until(at))
		r := eventRecord(c, g, pool)
		sent := time.Now()
		counted := sent.Sub(start) >= warmup
		wg.Add(1)
		p.Produce(ctx, r, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				failed.Store(&err)
				return
			}
			if counted {
				mu.Lock()
				lat = append(lat, float64(time.Since(sent).Microseconds())/1000)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if e := failed.Load(); e != nil {
		return fmt.Errorf("producing: %w", *e)
	}
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	res.paced(ru0, ru1, start, time.Now(), n, size, rate, lat)
	res.Note = fmt.Sprintf("send → ack (franz-go, acks=all, idempotent, linger 0), %d records measured after %s warm-up", len(lat), warmup)
	res.print()
	return nil
}

// produceTxnPaced is producePaced in Kafka transactions: the floor of
// exactly-once latency that the broker allows. Records are sent at a fixed
// rate; one committer puts every record waiting into a transaction, commits
// it, and starts the next as soon as that commit returns (a group commit: no
// exactly-once relay on one transactional id can commit sooner). Like an
// exactly-once relay's, each transaction also writes a position record to a
// compacted topic of one partition. Each
// record's latency is send → its transaction's commit marker appended in
// its partition, when a read_committed consumer may read it, taken as
// outboxd_eos's is (the marker's LogAppendTime, read back after the run);
// the note gives send → commit returned too, which comes before the
// markers are written. The client speaks transactions version 1 with a
// 0.5 ms CONCURRENT_TRANSACTIONS backoff, as outboxd's exactly-once producer
// does (sink.txnVersionOpts).
func produceTxnPaced(ctx context.Context, c common, size int, rate float64, duration, warmup time.Duration) error {
	pool := payloads(size)
	vs := kversion.Stable()
	vs.SetMaxKeyVersion(int16(kmsg.EndTxn), 4)
	p, err := rawProducer(c, kgo.ProducerLinger(0), kgo.TransactionalID("outboxbench-"+c.prefix),
		kgo.MaxVersions(vs), kgo.ConcurrentTransactionsBackoff(500*time.Microsecond))
	if err != nil {
		return err
	}
	defer p.Close()
	cl, adm, base, err := adminAt(ctx, c)
	if err != nil {
		return err
	}
	defer cl.Close()
	// Every transaction also writes a position, as an exactly-once relay's
	// must (outboxd's goes to kafka.positions_topic, compacted, one
	// partition): one more partition in each transaction and its markers.
	positions := c.prefix + "-positions"
	compact := "compact"
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": &compact}, positions); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("creating %s: %w", positions, err)
	}
	defer func() { _, _ = adm.DeleteTopics(context.WithoutCancel(ctx), positions) }()
	res := newResult(c, "live")
	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	type sent struct {
		g       int
		at      time.Time
		counted bool
	}
	n := int(rate * duration.Seconds())
	queue := make(chan sent, n)
	start := time.Now()
	go func() {
		defer close(queue)
		for g := range n {
			at := start.Add(time.Duration(float64(g) / rate * float64(time.Second)))
			time.Sleep(time.Until(at))
			now := time.Now()
			queue <- sent{g, now, now.Sub(start) >= warmup}
		}
	}()
	type place struct {
		topic     string
		partition int32
		offset    int64
	}
	var (
		returned []float64 // send → commit returned
		txns     int
		batch    []sent
		sentAt   = map[place]time.Time{} // the counted records, by where they landed
	)
	for first := range queue {
		batch = append(batch[:0], first)
	drain:
		for {
			select {
			case s, ok := <-queue:
				if !ok {
					break drain
				}
				batch = append(batch, s)
			default:
				break drain
			}
		}
		if err := p.BeginTransaction(); err != nil {
			return fmt.Errorf("beginning a transaction: %w", err)
		}
		recs := make([]*kgo.Record, len(batch))
		for i, s := range batch {
			recs[i] = eventRecord(c, s.g, pool)
			p.Produce(ctx, recs[i], nil)
		}
		p.Produce(ctx, &kgo.Record{Topic: positions, Key: []byte("outboxbench-" + c.prefix), Value: fmt.Appendf(nil, `{"sent":%d}`, batch[len(batch)-1].g)}, nil)
		if err := p.Flush(ctx); err != nil {
			return fmt.Errorf("flushing: %w", err)
		}
		if err := p.EndTransaction(ctx, kgo.TryCommit); err != nil {
			return fmt.Errorf("committing: %w", err)
		}
		txns++
		done := time.Now()
		for i, s := range batch {
			if s.counted {
				returned = append(returned, float64(done.Sub(s.at).Microseconds())/1000)
				sentAt[place{recs[i].Topic, recs[i].Partition, recs[i].Offset}] = s.at
			}
		}
	}
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1) // the read-back below is not the producer's
	sendEnd := time.Now()
	end, err := endOffsets(ctx, adm, c.topics())
	if err != nil {
		return err
	}
	rd, err := newCommittedReader(c.brokers, base)
	if err != nil {
		return err
	}
	defer rd.close()
	var lat []float64
	rd.visible = func(r *kgo.Record, at time.Time) {
		if t, ok := sentAt[place{r.Topic, r.Partition, r.Offset}]; ok {
			lat = append(lat, float64(at.Sub(t).Microseconds())/1000)
		}
	}
	if err := rd.until(ctx, func() bool { return rd.reached(end) }, func() error { return nil }, time.Minute); err != nil {
		return err
	}
	if len(lat) != len(sentAt) {
		return fmt.Errorf("%d of the %d measured records read back as committed", len(lat), len(sentAt))
	}
	res.paced(ru0, ru1, start, sendEnd, n, size, rate, lat)
	slices.Sort(returned)
	res.Note = fmt.Sprintf("send → commit marker appended (franz-go transactions v1, group commit with a position record, linger 0; send → commit returned: p50 %.1f ms, p99 %.1f ms), %d transactions, %d records measured after %s warm-up",
		percentile(returned, 0.5), percentile(returned, 0.99), txns, len(lat), warmup)
	res.print()
	return nil
}

// paced fills a paced run's result: its latencies lat (sorted here), the
// rates and the CPU used since ru0.
func (res *result) paced(ru0, ru1 syscall.Rusage, start, end time.Time, n, size int, rate float64, lat []float64) {
	slices.Sort(lat)
	res.Events, res.PayloadBytes = n, size
	res.TargetRate = rate
	res.WriteRate = float64(n) / end.Sub(start).Seconds()
	res.P50ms, res.P99ms, res.P999ms = percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 0.999)
	if len(lat) > 0 {
		res.Maxms = lat[len(lat)-1]
	}
	res.CPUSeconds = tv(ru1.Utime) + tv(ru1.Stime) - tv(ru0.Utime) - tv(ru0.Stime)
	res.CPUPer100k = res.CPUSeconds / float64(n) * 1e5
}
