package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/outboxd/outboxd/config"
)

// This file is kafka.delivery: exactly_once. A transactional Producer puts
// its records in Kafka transactions that the caller begins and commits; the
// commit writes the caller's position to kafka.positions_topic in the same
// transaction. Produce, the fence and the caps work as in at-least-once mode:
// a record's done reports that Kafka holds it in the open transaction, not
// that a read_committed consumer can see it. Only Commit says that.

// TxnMetrics are the metrics of exactly-once mode. Like Metrics they outlive
// Producers.
type TxnMetrics struct {
	committed, aborted, fenced prometheus.Counter
	duration                   prometheus.Histogram
	positionRead               prometheus.Gauge
}

// NewTxnMetrics registers the metrics of exactly-once mode on reg.
func NewTxnMetrics(reg prometheus.Registerer) *TxnMetrics {
	m := &TxnMetrics{
		committed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_sink_transactions_committed_total", Help: "Kafka transactions committed (kafka.delivery: exactly_once).",
		}),
		aborted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_sink_transactions_aborted_total", Help: "Kafka transactions aborted, or left open to be aborted, when a pipeline run ended.",
		}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_sink_transactions_fenced_total", Help: "Pipeline runs that ended because another instance took the transactional id over.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "outboxd_sink_transaction_duration_seconds", Help: "Time from a Kafka transaction's first record to its commit.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		positionRead: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_sink_position_read_lsn", Help: "The position (end LSN) read from kafka.positions_topic when the last pipeline run started; 0 when none was there.",
		}),
	}
	reg.MustRegister(m.committed, m.aborted, m.fenced, m.duration, m.positionRead)
	return m
}

// SetPositionRead exports the position read at a pipeline's start.
func (m *TxnMetrics) SetPositionRead(lsn uint64) { m.positionRead.Set(float64(lsn)) }

// txnState is a transactional Producer's state. Begin, Commit and Abort
// are called by one goroutine.
type txnState struct {
	id     string
	m      *TxnMetrics
	open   bool
	began  time.Time
	pid    atomic.Int64 // the producer id and epoch after Init and each commit,
	epoch  atomic.Int32 // to tell a fenced producer (Fenced)
	fenced bool
}

// NewTransactional returns a Producer for kafka.delivery: exactly_once with
// transactional id id. Like New it does not contact the brokers: nothing is
// fenced before Init.
//
// It speaks transactions version 1 (franz-go's path before KIP-890 part 2)
// on every cluster, and retries CONCURRENT_TRANSACTIONS after
// concurrentTxnBackoff (txnVersionOpts): see there why.
func NewTransactional(cfg config.Kafka, m *Metrics, tm *TxnMetrics, log *slog.Logger, id string) (*Producer, error) {
	opts := append([]kgo.Opt{kgo.TransactionalID(id), kgo.TransactionTimeout(cfg.TransactionTimeout)}, txnVersionOpts()...)
	p, err := New(cfg, m, log, opts...)
	if err != nil {
		return nil, err
	}
	p.txn = &txnState{id: id, m: tm}
	return p, nil
}

// concurrentTxnBackoff is how long the producer waits before it asks again
// to add a partition to a transaction when the coordinator answers
// CONCURRENT_TRANSACTIONS (franz-go's default: 20 ms). The next
// transaction's first partition meets it while the previous commit's
// markers are written, so up to one interval is added to nearly every
// commit (Kafka 4.3, one broker, 5,000 events/s: the flush before each
// commit, which holds this wait and the produce, took 2.7 ms at the
// median). At 2 ms the read_committed p50 at 1,000 events/s was 5.6 ms, at
// 0.5 ms 2.9 ms (issue 36 §2; quiet machine, back to back, two runs each:
// more than the interval's average share, as a late commit also delays the
// events that queue behind it). A retry is one small request to the
// coordinator, one every interval plus a round trip while a busy pipeline
// waits for the markers (not measured as a rate); franz-go raises the interval to 200 ms after 1 s of refusals.
// The loop is franz-go's CONCURRENT_TRANSACTIONS loop, which it takes only
// because the error is not retriable to its sinks
// (TestConcurrentTransactionsRetriedQuickly).
const concurrentTxnBackoff = 500 * time.Microsecond

// txnVersionOpts keep the transactional producer on transactions version 1
// and retry CONCURRENT_TRANSACTIONS after concurrentTxnBackoff.
//
// After EndTxn returns, the coordinator still writes the commit markers; a
// partition added to the next transaction before they are written is
// answered CONCURRENT_TRANSACTIONS. Under a steady load the pipeline adds
// the next transaction's first records at once, so it meets this after
// nearly every commit (issue 36 §2: on Kafka 4.3, 1,000 events/s, the
// markers took 2–4 ms). With transactions version 2 (KIP-890 part 2,
// finalised by default since Kafka 4.0) the client adds no partition
// itself: the broker adds it when the record comes, and it retries
// CONCURRENT_TRANSACTIONS itself after add.partitions.to.txn.retry.backoff.ms
// (20 ms, a broker setting) before it answers the produce request. That
// wait, hidden from the client, made a commit's flush 33 ms on average
// and the read_committed p50 40–80 ms. Capping EndTxn at version 4 keeps
// franz-go on version 1 (it opts into version 2 only when EndTxn v5,
// Produce v12 and TxnOffsetCommit v5 are all allowed): it adds partitions
// with AddPartitionsToTxn, whose CONCURRENT_TRANSACTIONS it retries
// after kgo.ConcurrentTransactionsBackoff, which outboxd sets short. On
// Kafka 3.6 and later the broker still verifies a producer's first write
// to each partition of a transaction against the coordinator (KIP-890
// part 1); what version 1 lacks is version 2's epoch bump per transaction,
// which the fence (the epoch bump of Init) does not need.
func txnVersionOpts() []kgo.Opt {
	vs := kversion.Stable()
	vs.SetMaxKeyVersion(int16(kmsg.EndTxn), 4)
	return []kgo.Opt{kgo.MaxVersions(vs), kgo.ConcurrentTransactionsBackoff(concurrentTxnBackoff)}
}

// TransactionalID returns the producer's transactional id ("" when it is
// not transactional).
func (p *Producer) TransactionalID() string {
	if p.txn == nil {
		return ""
	}
	return p.txn.id
}

// FencedError reports that another producer initialised the same
// transactional id: another outboxd took over.
type FencedError struct {
	TransactionalID string
	Err             error
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("another outboxd took over: Kafka fenced transactional id %q (%v); nothing past this instance's last committed transaction is visible or confirmed",
		e.TransactionalID, e.Err)
}

func (e *FencedError) Unwrap() error { return e.Err }

// fencedErr reports whether err is Kafka's answer to a fenced producer.
func fencedErr(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.InvalidProducerIDMapping)
}

// AsFenced returns err as a *FencedError when it is Kafka's answer to a
// fenced transactional producer, and err otherwise.
func (p *Producer) AsFenced(err error) error {
	if p.txn == nil {
		return err
	}
	err = AsFenced(p.txn.id, err)
	var fe *FencedError
	if errors.As(err, &fe) {
		p.noteFenced()
	}
	return err
}

// AsFenced returns err as a *FencedError of transactional id id when it is
// Kafka's answer to a fenced producer (a record's or a transaction's), and
// err otherwise.
func AsFenced(id string, err error) error {
	var fe *FencedError
	if err == nil || errors.As(err, &fe) || !fencedErr(err) {
		return err
	}
	return &FencedError{TransactionalID: id, Err: err}
}

func (p *Producer) noteFenced() {
	if !p.txn.fenced {
		p.txn.fenced = true
		p.txn.m.fenced.Inc()
	}
}

// Init initialises the transactional producer: Kafka aborts (or completes)
// the transaction a previous holder of the id left open, and fences that
// holder. Call it only while holding the slot.
func (p *Producer) Init(ctx context.Context) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DeliveryTimeout)
	defer cancel()
	id, epoch, err := p.client.ProducerID(ctx)
	if err != nil {
		hint := ""
		if errors.Is(err, kerr.TransactionalIDAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed) {
			hint = "; grant the principal Write and Describe on the TransactionalId resource"
		}
		return fmt.Errorf("%w%s", p.timedOut(fmt.Sprintf("initialising the transactional producer %q", p.txn.id), start, err), hint)
	}
	p.txn.pid.Store(id)
	p.txn.epoch.Store(int32(epoch))
	return nil
}

// InTransaction reports whether a transaction is open.
func (p *Producer) InTransaction() bool { return p.txn.open }

// Begin opens a transaction.
func (p *Producer) Begin() error {
	if err := p.client.BeginTransaction(); err != nil {
		return fmt.Errorf("beginning a Kafka transaction: %w", err)
	}
	p.txn.open, p.txn.began = true, time.Now()
	return nil
}

// Began returns when the open transaction began.
func (p *Producer) Began() time.Time { return p.txn.began }

// Commit writes position to kafka.positions_topic, keyed by the
// transactional id, and commits the open transaction with it. When it
// returns nil a read_committed consumer sees every record handed over since
// Begin, and the position; otherwise the transaction is not committed (or
// its outcome is unknown: the next Init settles it) and the caller must end
// the run.
func (p *Producer) Commit(ctx context.Context, position []byte) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DeliveryTimeout)
	defer cancel()
	var posErr atomic.Pointer[error]
	p.client.Produce(p.fence, &kgo.Record{Topic: p.cfg.PositionsTopic, Key: []byte(p.txn.id), Value: position}, func(_ *kgo.Record, err error) {
		if err != nil {
			posErr.Store(&err)
		}
	})
	if err := p.client.Flush(ctx); err != nil {
		return p.timedOut("flushing a Kafka transaction", start, err)
	}
	if perr := posErr.Load(); perr != nil {
		return p.AsFenced(fmt.Errorf("writing the position to %s: %w", p.cfg.PositionsTopic, *perr))
	}
	if p.fence.Err() != nil {
		return context.Cause(p.fence) // a record failed: never commit past it
	}
	if err := p.client.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return p.AsFenced(p.timedOut("committing a Kafka transaction", start, err))
	}
	p.txn.open = false
	p.txn.m.committed.Inc()
	p.txn.m.duration.Observe(time.Since(p.txn.began).Seconds())
	// Safe after a commit: the producer id has no error to reload.
	if id, epoch, err := p.client.ProducerID(ctx); err == nil {
		p.txn.pid.Store(id)
		p.txn.epoch.Store(int32(epoch))
	}
	return nil
}

// Abort aborts the open transaction, if any, so that read_committed
// consumers need not wait for its timeout. It fails the records not yet
// written. It returns a *FencedError when Kafka answers that another
// producer took the id over.
func (p *Producer) Abort(ctx context.Context) error {
	if !p.txn.open {
		return nil
	}
	p.txn.open = false
	p.txn.m.aborted.Inc()
	if p.txn.fenced {
		return nil // Kafka aborted it when it fenced this producer
	}
	if err := p.client.AbortBufferedRecords(ctx); err != nil {
		return fmt.Errorf("aborting a Kafka transaction: %w", err)
	}
	if err := p.client.EndTransaction(ctx, kgo.TryAbort); err != nil {
		return p.AsFenced(fmt.Errorf("aborting a Kafka transaction: %w", err))
	}
	return nil
}

// Fenced asks the transaction coordinator whether another producer has
// initialised the transactional id since this one last committed. It never
// initialises anything itself.
func (p *Producer) Fenced(ctx context.Context) (bool, error) {
	if p.txn.fenced {
		return true, nil
	}
	pid := p.txn.pid.Load()
	if pid == 0 {
		return false, nil // never initialised: nothing to be fenced from
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ds, err := p.admin.DescribeTransactions(ctx, p.txn.id)
	if err != nil {
		return false, err
	}
	d, ok := ds[p.txn.id]
	if !ok {
		return false, fmt.Errorf("the transaction coordinator does not know transactional id %q", p.txn.id)
	}
	if d.Err != nil {
		return false, d.Err
	}
	// Another producer's initialisation bumps the epoch (or changes the
	// id). Under transactions version 1 (txnVersionOpts) a commit does not,
	// even one whose answer this producer did not read, so any newer epoch
	// is another producer's.
	fenced := d.ProducerID != pid || int32(d.ProducerEpoch) > p.txn.epoch.Load()
	if fenced {
		p.noteFenced()
	}
	return fenced, nil
}

// EnsurePositionsTopic creates kafka.positions_topic, compacted with one
// partition, when it is missing and topic creation is outboxd's job.
func (p *Producer) EnsurePositionsTopic(ctx context.Context) error {
	topic := p.cfg.PositionsTopic
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DeliveryTimeout)
	defer cancel()
	td, err := p.admin.ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("looking up the positions topic %q: %w", topic, err)
	}
	if d, ok := td[topic]; ok && d.Err == nil && len(d.Partitions) > 0 {
		p.known[topic] = len(d.Partitions)
		return nil
	}
	if p.cfg.TopicCreation != config.TopicCreationAdmin {
		return fmt.Errorf("the positions topic %q does not exist; create it with cleanup.policy=compact (one partition is enough), "+
			"or set kafka.topic_creation: admin", topic)
	}
	compact := "compact"
	resp, err := p.admin.CreateTopic(ctx, 1, int16(p.cfg.TopicReplicationFactor), map[string]*string{"cleanup.policy": &compact}, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("creating the positions topic %q (cleanup.policy=compact): %w; create it by hand or fix the broker's permissions", topic, err)
	}
	if err == nil {
		p.m.topicsCreated.Inc()
	}
	n, err := p.waitUsable(ctx, topic)
	if err != nil {
		return err
	}
	p.known[topic] = n
	p.client.ForceMetadataRefresh()
	return nil
}

// ReadPosition returns the value of the last committed record of
// kafka.positions_topic keyed by the transactional id, read with
// isolation.level=read_committed up to the high watermark the broker
// reports when it starts; ok is false when there is none. A read that does
// not reach the high watermark within kafka.delivery_timeout fails: franz-go
// answers a partition it cannot fetch (no leader, being moved) with empty
// polls, which look like the end of the topic, and an older position would
// write committed transactions again. Call it after Init, which settles the
// previous holder's last transaction.
func (p *Producer) ReadPosition(ctx context.Context) (value []byte, ok bool, err error) {
	return p.readPosition(ctx, kgo.ReadCommitted())
}

// PeekPosition is ReadPosition with isolation.level=read_uncommitted: the
// value of the key's last record whose transaction committed or is still
// open (an aborted one is passed over: a fenced writer's aborted position
// decides nothing). It needs no Init, and so fences nobody: a
// caller can tell from it, before fencing the id's holder, whether the id
// is another deployment's.
func (p *Producer) PeekPosition(ctx context.Context) (value []byte, ok bool, err error) {
	return p.readPosition(ctx, kgo.ReadUncommitted())
}

func (p *Producer) readPosition(ctx context.Context, isolation kgo.IsolationLevel) (value []byte, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DeliveryTimeout)
	defer cancel()
	topic, key := p.cfg.PositionsTopic, p.txn.id
	starts, err := listOffsets(ctx, p.admin.ListStartOffsets, topic)
	if err != nil {
		return nil, false, fmt.Errorf("reading the start offsets of %s: %w", topic, err)
	}
	// The high watermarks, not the last stable offsets: a transaction of
	// another id (another shard or deployment) still open in a partition
	// holds its last stable offset back, and this id's last position may
	// have been committed after it. Reading committed records up to the
	// high watermark waits until that transaction ends.
	ends, err := listOffsets(ctx, p.admin.ListEndOffsets, topic)
	if err != nil {
		return nil, false, fmt.Errorf("reading the end offsets of %s: %w", topic, err)
	}
	var found struct {
		value []byte
		ok    bool
	}
	// Read each partition's tail, going further back until the key turns
	// up: the last record of the key is near the end unless many other
	// instances share the partition.
	for _, lo := range ends[topic] {
		start := int64(0)
		if s, ok := starts.Lookup(topic, lo.Partition); ok {
			start = s.Offset
		}
		end := lo.Offset
		for window := int64(1000); ; window *= 8 {
			from := max(start, end-window)
			v, ok, err := p.readRange(ctx, isolation, topic, lo.Partition, from, end, key)
			if err != nil {
				return nil, false, err
			}
			if ok {
				found.value, found.ok = v, true
				break
			}
			if from == start {
				break
			}
		}
		if found.ok {
			break // one partition holds the key
		}
	}
	return found.value, found.ok, nil
}

// listOffsets asks list (the start or end offsets) for topic's partitions
// until every partition answers, or ctx (delivery_timeout) ends. A
// partition error that a broker gives while leadership moves
// (OFFSET_NOT_AVAILABLE right after a leader election, NOT_LEADER, …) is
// retried, as the producer retries; only UNKNOWN_TOPIC_OR_PARTITION and the
// errors that are not retriable end the read at once.
func listOffsets(ctx context.Context, list func(context.Context, ...string) (kadm.ListedOffsets, error), topic string) (kadm.ListedOffsets, error) {
	var last error // the last retriable answer
	for {
		o, err := list(ctx, topic)
		if err == nil {
			err = o.Error()
		}
		switch {
		case err == nil:
			return o, nil
		case errors.Is(ctx.Err(), context.DeadlineExceeded) && last != nil:
			hint := "check that the brokers holding its replicas are up"
			if errors.Is(last, kerr.OffsetNotAvailable) {
				hint = "a new leader cannot tell a partition's end until enough of its followers are back in sync: check that the brokers holding its replicas are up (min.insync.replicas)"
			}
			return nil, fmt.Errorf("not every partition answered within kafka.delivery_timeout, the last answer: %w (%w); %s", last, ctx.Err(), hint)
		case ctx.Err() != nil && last != nil:
			return nil, fmt.Errorf("%w (the last answer: %w)", ctx.Err(), last)
		case ctx.Err() != nil, !kerr.IsRetriable(err), errors.Is(err, kerr.UnknownTopicOrPartition):
			return nil, err
		}
		last = err
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readRange reads offsets [from, end) of one partition, at isolation, and
// returns the value of the last record with key that was not aborted
// (keyRecords: read_uncommitted returns aborted records too). It returns only once it
// has received a record at or past end-1: the last offset below the high
// watermark end is a transaction marker (kept with KeepControlRecords) or a
// committed record, in the active segment, which compaction never cleans;
// records of aborted transactions below it are skipped by the client, and
// a compaction gap further down is passed over. Until then an empty poll
// is no end: the broker may not be answering.
func (p *Producer) readRange(ctx context.Context, isolation kgo.IsolationLevel, topic string, partition int32, from, end int64, key string) ([]byte, bool, error) {
	if from >= end {
		return nil, false, nil
	}
	opts, err := ClientOptions(p.cfg)
	if err != nil {
		return nil, false, err
	}
	opts = append(opts,
		kgo.FetchIsolationLevel(isolation),
		kgo.KeepControlRecords(), // the markers tell where the stable end is
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().At(from)}}),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, false, fmt.Errorf("creating a Kafka client to read %s: %w", topic, err)
	}
	defer cl.Close()
	var keyed keyRecords
	last := from - 1 // the highest offset received
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); errors.Is(err, context.DeadlineExceeded) {
			return nil, false, fmt.Errorf("reading %s[%d]: its high watermark %d was not reached within kafka.delivery_timeout (%s; last offset received: %d): "+
				"the partition has no leader or is not answering, or another producer's transaction in it is still open; "+
				"the position is known only once read to the end, so the pipeline restarts and reads again: %w",
				topic, partition, end, p.cfg.DeliveryTimeout, last, err)
		} else if err != nil {
			return nil, false, fmt.Errorf("reading %s[%d]: %w", topic, partition, err)
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = err
			}
		})
		if ferr != nil {
			return nil, false, fmt.Errorf("reading %s[%d]: %w", topic, partition, ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			last = max(last, r.Offset)
			if r.Offset < end {
				keyed.add(r, key)
			}
		})
		if last >= end-1 {
			value, ok := keyed.last()
			return value, ok, nil
		}
	}
}

// keyRecords collects, in offset order, the records of one key and tells
// which of them were aborted. read_uncommitted (PeekPosition) returns the
// records of aborted transactions too: a position aborted when its writer
// was fenced (another deployment sharing the id, say) stays in the active
// segment for days and would otherwise decide the peek. A transactional
// record is aborted when its producer's next control record in the
// partition is an abort marker; one with no marker after it belongs to a
// transaction still open and counts.
type keyRecords struct {
	recs []keyRecord
}

type keyRecord struct {
	value   []byte
	pid     int64 // the producer id, when transactional
	txn     bool
	aborted bool
	settled bool // its transaction's marker was seen
}

func (k *keyRecords) add(r *kgo.Record, key string) {
	if r.Attrs.IsControl() {
		var ck kmsg.ControlRecordKey
		if ck.ReadFrom(r.Key) != nil {
			return
		}
		for i := range k.recs {
			if c := &k.recs[i]; c.txn && !c.settled && c.pid == r.ProducerID {
				c.settled, c.aborted = true, ck.Type == kmsg.ControlRecordKeyTypeAbort
			}
		}
		return
	}
	if string(r.Key) == key {
		k.recs = append(k.recs, keyRecord{value: r.Value, pid: r.ProducerID, txn: r.Attrs.IsTransactional()})
	}
}

// last returns the value of the last record that was not aborted.
func (k *keyRecords) last() ([]byte, bool) {
	for i := len(k.recs) - 1; i >= 0; i-- {
		if !k.recs[i].aborted {
			return k.recs[i].value, true
		}
	}
	return nil, false
}
