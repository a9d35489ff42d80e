package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/kfaketest"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// The kfake fault tests run the relay's pipeline (routing, the tracker's
// Begin, Add and Commit, a failed record ending the run) on a real
// sink.Producer against franz-go's in-process kfake, whose ControlKey
// injects broker errors; each run starts from the position the previous one
// confirmed, as the relay's restarts do. After every run they check the ack
// rule: nothing at or below the confirmed position is undelivered. At the
// end they read the topic back and check that every event arrived and that
// first deliveries of each key follow commit order.

// faultTopic is where the workload's rows go: route_by value "orders", through
// the default topic template ${routedByValue}-events.
const faultTopic = "orders-events"

// textOutboxRel is the default outbox table with a text id column.
var textOutboxRel = &wal.Relation{ID: 16400, Namespace: "public", Name: "outbox", Columns: []wal.Column{
	{Name: "id", TypeOID: 25, Key: true}, // text
	{Name: "aggregate_type", TypeOID: 25},
	{Name: "aggregate_id", TypeOID: 25},
	{Name: "event_type", TypeOID: 25},
	{Name: "payload", TypeOID: 3802}, // jsonb
}}

type fakeTxn struct {
	lsn   wal.LSN    // the commit's end LSN
	items []wal.Item // Begin, the inserts, Commit
	ids   []string
	seqs  []int
}

// workload is n transactions of 1..5 outbox rows over 20 keys.
func workload(n int) []fakeTxn {
	seq := map[string]int{}
	txns := make([]fakeTxn, n)
	id := 0
	text := func(s string) wal.Datum { return wal.Datum{Kind: wal.DatumText, Data: []byte(s)} }
	for i := range txns {
		tx := &txns[i]
		tx.lsn = wal.LSN(100 * (i + 1))
		commitTime := time.Now()
		tx.items = append(tx.items, &wal.Begin{XID: uint32(i + 1), FinalLSN: tx.lsn - 10, CommitTime: commitTime})
		for j := range 1 + (i*7)%5 {
			key := fmt.Sprintf("k%02d", (i*3+j*11)%20)
			seq[key]++
			id++
			tx.items = append(tx.items, &wal.Change{Op: wal.Insert, XID: uint32(i + 1), LSN: tx.lsn - 50 + wal.LSN(j), CommitTime: commitTime,
				Relation: textOutboxRel, Tuple: []wal.Datum{text(fmt.Sprint(id)), text("orders"), text(key), text("OrderChanged"),
					text(fmt.Sprintf(`{"seq": %d}`, seq[key]))}})
			tx.ids = append(tx.ids, fmt.Sprint(id))
			tx.seqs = append(tx.seqs, seq[key])
		}
		tx.items = append(tx.items, &wal.Commit{XID: uint32(i + 1), CommitLSN: tx.lsn - 10, EndLSN: tx.lsn, CommitTime: commitTime})
	}
	return txns
}

type tWriter struct {
	t    *testing.T
	done *atomic.Bool
}

func (w tWriter) Write(p []byte) (int, error) {
	if !w.done.Load() {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// faultOutcome is what runRelay observed.
type faultOutcome struct {
	runs, failedRuns int
	failures         []string
}

// watched is the producer the pipeline runs on: a sink.Producer whose
// outcomes are noted before the pipeline's callback gets them.
type watched struct {
	t     *testing.T
	p     *sink.Producer
	wg    *sync.WaitGroup
	mu    *sync.Mutex
	acked map[string]bool
}

func (w watched) Produce(ctx context.Context, rec *router.Record, done func(error)) error {
	id := strings.Clone(rec.EventID)
	w.wg.Add(1)
	err := w.p.Produce(ctx, rec, func(err error) {
		defer w.wg.Done()
		if err != nil {
			var de *sink.DeliveryError
			if !errors.As(err, &de) || de.EventID != id {
				w.t.Errorf("record %s failed with %v, want a *sink.DeliveryError naming it", id, err)
			}
		} else {
			w.mu.Lock()
			w.acked[id] = true
			w.mu.Unlock()
		}
		done(err)
	})
	if err != nil {
		w.wg.Done()
	}
	return err
}

// runRelay streams txns through the relay's pipeline on fresh Producers
// until every transaction is confirmed, at most maxRuns times.
func runRelay(t *testing.T, c *kfake.Cluster, txns []fakeTxn, maxRuns int, tt faultCase) faultOutcome {
	t.Helper()
	cfg := config.Default()
	cfg.Kafka.Brokers = c.ListenAddrs()
	cfg.Kafka.TopicPartitions = 3
	cfg.Kafka.TopicReplicationFactor = 1
	cfg.Kafka.MaxBufferedRecords = 50
	if tt.buffered > 0 {
		cfg.Kafka.MaxBufferedRecords = tt.buffered
	}
	cfg.Kafka.DeliveryTimeout = tt.deliveryTimeout
	quiet := &atomic.Bool{}
	t.Cleanup(func() { quiet.Store(true) })
	log := slog.New(slog.NewTextHandler(tWriter{t, quiet}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m := sink.NewMetrics(prometheus.NewRegistry())
	s := setupOf(cfg, log)

	var mu sync.Mutex
	acked := map[string]bool{}
	var out faultOutcome
	confirmed := wal.LSN(0)
	last := txns[len(txns)-1].lsn
	for confirmed < last {
		if out.runs == maxRuns {
			t.Fatalf("not everything confirmed after %d runs (confirmed %d of %d); failures: %v", maxRuns, confirmed, last, out.failures)
		}
		out.runs++
		p, err := sink.New(cfg.Kafka, m, log, tt.first...)
		if err != nil {
			t.Fatal(err)
		}
		tracker := checkpoint.New(confirmed)
		run, fail := context.WithCancelCause(context.Background())
		var wg sync.WaitGroup
		// The stall watchdog, as the relay runs it: a run whose records
		// see no acknowledgement for the delivery timeout ends.
		watchdog := make(chan struct{})
		go func() {
			defer close(watchdog)
			if err := p.Watch(run, nil); err != nil {
				fail(err)
			}
		}()
		// The stream's part: one batch per transaction after the confirmed
		// position, until the run ends (a failure cancels it).
		batches := make(chan []wal.Item, 8)
		go func(from wal.LSN) {
			defer close(batches)
			for _, tx := range txns {
				if tx.lsn <= from {
					continue
				}
				if tt.pace > 0 {
					time.Sleep(tt.pace)
				}
				select {
				case batches <- tx.items:
				case <-run.Done():
					return
				}
			}
		}(confirmed)
		pl := pipelineOn(t, s, run, tracker, watched{t: t, p: p, wg: &wg, mu: &mu, acked: acked}, fail)
		pipeErr := pl.Run(batches)
		pl.Close()
		if pipeErr == nil && context.Cause(run) == nil {
			// Wait for the last acks (bounded by the delivery timeout).
			ctx, cancel := context.WithTimeout(run, tt.deliveryTimeout+30*time.Second)
			if err := tracker.WaitAcked(ctx); err != nil && context.Cause(run) == nil {
				t.Fatalf("records neither acked nor failed within %s", tt.deliveryTimeout+30*time.Second)
			}
			cancel()
		}
		p.Close() // fails whatever is still buffered
		wg.Wait()
		cause := context.Cause(run)
		if cause == nil {
			cause = pipeErr
		}
		fail(nil) // ends the watchdog and the feeder of a run that did not fail
		<-watchdog
		for range batches { // what the feeder sent after the pipeline stopped
		}
		if cause != nil {
			out.failedRuns++
			out.failures = append(out.failures, cause.Error())
		}
		// The ack rule: nothing at or below the confirmed position is undelivered.
		got := tracker.Confirmed()
		mu.Lock()
		for _, tx := range txns {
			if tx.lsn > got {
				break
			}
			for _, id := range tx.ids {
				if !acked[id] {
					t.Errorf("run %d confirmed LSN %d, past event %s (txn %d) that Kafka never acknowledged", out.runs, got, id, tx.lsn)
				}
			}
		}
		mu.Unlock()
		if got < confirmed {
			t.Fatalf("confirmed position went back from %d to %d", confirmed, got)
		}
		confirmed = got
	}
	return out
}

// verify reads the topic back: every event delivered, each key on one
// partition, first deliveries in commit order. It returns the duplicates.
func verify(t *testing.T, c *kfake.Cluster, txns []fakeTxn) int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(faultTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	want := map[string]int{} // event id -> seq
	for _, tx := range txns {
		for i, id := range tx.ids {
			want[id] = tx.seqs[i]
		}
	}
	seen := map[string]int{}
	lastSeq := map[string]int{}
	partOf := map[string]int32{}
	dups := 0
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < len(want) && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			id := ""
			for _, h := range r.Headers {
				if h.Key == "id" {
					id = string(h.Value)
				}
			}
			key := string(r.Key)
			if p, ok := partOf[key]; ok && p != r.Partition {
				t.Errorf("key %s on partitions %d and %d", key, p, r.Partition)
			}
			partOf[key] = r.Partition
			seen[id]++
			if seen[id] > 1 {
				dups++
				return
			}
			s, ok := want[id]
			if !ok {
				t.Errorf("phantom record id=%q", id)
				return
			}
			if s <= lastSeq[key] {
				t.Errorf("key %s: seq %d first delivered after seq %d (offset %d)", key, s, lastSeq[key], r.Offset)
			}
			lastSeq[key] = s
		})
	}
	for id := range want {
		if seen[id] == 0 {
			t.Errorf("event %s lost", id)
		}
	}
	return dups
}

// everyNth injects fault into every nth produce request, limit times.
func everyNth(c *kfake.Cluster, n, limit int, fault func(req kmsg.Request) (kmsg.Response, error)) *atomic.Int64 {
	var seen, injected atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if seen.Add(1)%int64(n) != 0 || injected.Load() >= int64(limit) {
			return nil, nil, false
		}
		injected.Add(1)
		resp, err := fault(req)
		return resp, err, true
	})
	return &injected
}

// faultCase is one kind of injected broker fault.
type faultCase struct {
	name            string
	brokers         int
	deliveryTimeout time.Duration
	inject          func(t *testing.T, c *kfake.Cluster) (stop func(), injected func() int64)
	wantFailedRuns  bool // a non-retriable fault must end at least one run
	// first: franz-go options ahead of outboxd's own (hooks that run
	// before outboxd's).
	first []kgo.Opt
	// buffered is kafka.max_buffered_records (default 50).
	buffered int
	// pace is a pause before each transaction is handed over.
	pace time.Duration
}

// Retriable faults: franz-go retries them, no run fails, nothing is lost,
// duplicated or reordered.
func TestProducerUnderBrokerFaults(t *testing.T) {
	runFaultCases(t, []faultCase{
		{name: "retriable errors", brokers: 1, deliveryTimeout: time.Minute,
			inject: func(t *testing.T, c *kfake.Cluster) (func(), func() int64) {
				codes := []int16{kerr.NotLeaderForPartition.Code, kerr.RequestTimedOut.Code, kerr.NotEnoughReplicas.Code, kerr.NotEnoughReplicasAfterAppend.Code}
				var i atomic.Int64
				n := everyNth(c, 3, 8, func(req kmsg.Request) (kmsg.Response, error) {
					return kfaketest.ProduceResponse(req, codes[i.Add(1)%int64(len(codes))]), nil
				})
				return func() {}, n.Load
			}},
		{name: "leader changes", brokers: 3, deliveryTimeout: time.Minute,
			inject: func(t *testing.T, c *kfake.Cluster) (func(), func() int64) {
				var n atomic.Int64
				stop := make(chan struct{})
				done := make(chan struct{})
				// The first shuffle comes with the first produce request,
				// then one every 20 ms: a quick run (300 transactions can
				// take under 20 ms) still meets a leader change.
				producing := make(chan struct{})
				var once sync.Once
				c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
					once.Do(func() { close(producing) }) // an unhandled request keeps its control
					return nil, nil, false
				})
				go func() {
					defer close(done)
					select {
					case <-stop:
						return
					case <-producing:
					}
					for {
						c.ShufflePartitionLeaders()
						n.Add(1)
						select {
						case <-stop:
							return
						case <-time.After(20 * time.Millisecond):
						}
					}
				}()
				return func() { close(stop); <-done }, n.Load
			}},
		{name: "request timeouts and dropped connections", brokers: 1, deliveryTimeout: time.Minute,
			inject: func(t *testing.T, c *kfake.Cluster) (func(), func() int64) {
				var i atomic.Int64
				n := everyNth(c, 4, 40, func(req kmsg.Request) (kmsg.Response, error) {
					if i.Add(1)%2 == 0 {
						return nil, errors.New("connection dropped by the test") // kfake closes the connection
					}
					c.SleepControl(func() { time.Sleep(200 * time.Millisecond) })
					return kfaketest.ProduceResponse(req, kerr.RequestTimedOut.Code), nil
				})
				return func() {}, n.Load
			}},
	})
}

func runFaultCases(t *testing.T, tests []faultCase) {
	txns := workload(300)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(tt.brokers))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			stop, injected := tt.inject(t, c)
			out := runRelay(t, c, txns, 50, tt)
			stop()
			dups := verify(t, c, txns)
			t.Logf("faults injected %d, runs %d (failed %d), duplicates %d", injected(), out.runs, out.failedRuns, dups)
			if injected() == 0 {
				t.Error("no fault was injected; the test proves nothing")
			}
			if tt.wantFailedRuns && out.failedRuns == 0 {
				t.Error("no run failed: a non-retriable error must stop the pipeline")
			}
			if !tt.wantFailedRuns && out.failedRuns > 0 {
				t.Errorf("retriable faults failed %d runs: %v", out.failedRuns, out.failures)
			}
			if out.failedRuns == 0 && dups > 0 {
				t.Errorf("%d duplicates without a failed run (the idempotent producer should have removed them)", dups)
			}
		})
	}
}

// Faults that fail records: the run ends and the next one starts from the
// confirmed position. Nothing may be confirmed past a failed record, and
// first deliveries of a key follow commit order.
func TestProducerFailureKeepsKeyOrder(t *testing.T) {
	// rejectEvery rejects every nth produce request, six times.
	rejectEvery := func(nth int) func(t *testing.T, c *kfake.Cluster) (func(), func() int64) {
		return func(t *testing.T, c *kfake.Cluster) (func(), func() int64) {
			codes := []int16{kerr.InvalidRecord.Code, kerr.CorruptMessage.Code, kerr.MessageTooLarge.Code, kerr.TopicAuthorizationFailed.Code}
			var i atomic.Int64
			n := everyNth(c, nth, 6, func(req kmsg.Request) (kmsg.Response, error) {
				return kfaketest.ProduceResponse(req, codes[i.Add(1)%int64(len(codes))]), nil
			})
			return func() {}, n.Load
		}
	}
	runFaultCases(t, []faultCase{
		{name: "non-retriable errors", brokers: 1, deliveryTimeout: time.Minute, wantFailedRuns: true, inject: rejectEvery(7)},
		// franz-go reports a rejection on another goroutine. Delaying that
		// report (with room to hand over every record meanwhile) widens the
		// moment in which a record handed over would be written ahead of the
		// rejected one: the fence must break when the response is read, not
		// when it is reported.
		{name: "non-retriable errors reported late", brokers: 1, deliveryTimeout: time.Minute, wantFailedRuns: true, inject: rejectEvery(2),
			buffered: 5000, pace: 100 * time.Microsecond, first: []kgo.Opt{kgo.WithHooks(&slowFailureReport{d: 20 * time.Millisecond})}},
		{name: "retriable errors past the delivery timeout", brokers: 1, deliveryTimeout: 2 * time.Second, wantFailedRuns: true,
			inject: func(t *testing.T, c *kfake.Cluster) (func(), func() int64) {
				var n, seen atomic.Int64
				start := time.Now()
				c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
					c.KeepControl()
					// Refuse every produce for a window after the 10th request.
					if seen.Add(1) < 10 || time.Since(start) > 6*time.Second {
						return nil, nil, false
					}
					n.Add(1)
					c.SleepControl(func() { time.Sleep(50 * time.Millisecond) })
					return kfaketest.ProduceResponse(req, kerr.NotLeaderForPartition.Code), nil, true
				})
				return func() {}, n.Load
			}},
	})
}

// slowFailureReport delays franz-go's report of the first failed record of
// each run (its hooks and promises run one after another on one goroutine).
type slowFailureReport struct {
	d    time.Duration
	last atomic.Int64 // unix nanos of the last delay
}

func (h *slowFailureReport) OnProduceRecordUnbuffered(_ *kgo.Record, err error) {
	if now := time.Now().UnixNano(); err != nil && now-h.last.Load() > int64(10*h.d) {
		h.last.Store(now)
		time.Sleep(h.d)
	}
}
