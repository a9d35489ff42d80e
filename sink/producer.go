package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"github.com/twmb/franz-go/plugin/kprom"
	"golang.org/x/sync/semaphore"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
)

// Metrics are the sink's Prometheus metrics. They outlive Producers, which
// are replaced on every pipeline restart.
type Metrics struct {
	produced      *prometheus.CounterVec
	producedBytes *prometheus.CounterVec
	errors        *prometheus.CounterVec
	topicsCreated prometheus.Counter
	commitToAck   prometheus.Histogram
	batchRecords  prometheus.Histogram
	reg           prometheus.Registerer

	mu     sync.RWMutex
	topics map[string]topicCounters // at most maxTopicLabels, then "other"
}

type topicCounters struct{ records, bytes prometheus.Counter }

// maxTopicLabels bounds the topic label of the produced-records metrics.
const maxTopicLabels = 100

// NewMetrics registers the sink's metrics, and franz-go's client metrics
// (outboxd_kafka_*), on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		produced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_sink_records_produced_total", Help: "Records acknowledged by Kafka, by topic (at most 100 topics, then \"other\").",
		}, []string{"topic"}),
		producedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_sink_produced_bytes_total", Help: "Key and value bytes of records acknowledged by Kafka, by topic.",
		}, []string{"topic"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_sink_produce_errors_total", Help: "Records that failed to be delivered, by kind (each stops and restarts the pipeline).",
		}, []string{"kind"}),
		topicsCreated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_sink_topics_created_total", Help: "Topics created by outboxd.",
		}),
		commitToAck: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "outboxd_sink_commit_to_ack_seconds", Help: "Time from an event's commit in Postgres to its acknowledgement by Kafka.",
			// 0.5 ms to 5 min; 30 s is a bucket boundary because the latency alert's threshold is.
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300},
		}),
		batchRecords: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "outboxd_sink_batch_records", Help: "Records per batch written to Kafka.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14), // 1 to 8192
		}),
		topics: map[string]topicCounters{},
	}
	reg.MustRegister(m.produced, m.producedBytes, m.errors, m.topicsCreated, m.commitToAck, m.batchRecords)
	m.reg = replacingRegisterer{reg}
	return m
}

func (m *Metrics) forTopic(topic string) topicCounters {
	m.mu.RLock()
	c, ok := m.topics[topic]
	m.mu.RUnlock()
	if ok {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok = m.topics[topic]; ok {
		return c
	}
	label := topic
	if len(m.topics) >= maxTopicLabels {
		label = "other"
	}
	c = topicCounters{m.produced.WithLabelValues(label), m.producedBytes.WithLabelValues(label)}
	m.topics[topic] = c
	return c
}

// errorKind names a delivery error for the errors metric, from a bounded set.
func errorKind(err error) string {
	var ke *kerr.Error
	switch {
	case errors.As(err, &ke):
		return ke.Message
	case errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, context.DeadlineExceeded):
		return "delivery_timeout"
	case errors.Is(err, kgo.ErrClientClosed), errors.Is(err, context.Canceled):
		return "client_closed"
	case errors.Is(err, kgo.ErrRecordRetries):
		return "retries_exhausted"
	}
	return "other"
}

// kpromClient is franz-go's client metrics (outboxd_kafka_*: connections,
// requests, bytes, throttling) without its counters per produced batch, which
// outboxd_sink_* already keep by topic. kprom builds a label map for every
// batch, an allocation per batch that small transactions make one per
// record.
type kpromClient struct{ *kprom.Metrics }

func (kpromClient) OnProduceBatchWritten(kgo.BrokerMetadata, string, int32, kgo.ProduceBatchMetrics) {
}

// OnProduceBatchWritten implements kgo.HookProduceBatchWritten.
func (m *Metrics) OnProduceBatchWritten(_ kgo.BrokerMetadata, _ string, _ int32, b kgo.ProduceBatchMetrics) {
	m.batchRecords.Observe(float64(b.NumRecords))
}

// replacingRegisterer lets franz-go's metrics be registered again by each
// new client (one per pipeline run): the previous client's collectors are
// replaced, so their counters restart from zero, which Prometheus' rate()
// handles as a reset.
type replacingRegisterer struct{ prometheus.Registerer }

func (r replacingRegisterer) Register(c prometheus.Collector) error {
	err := r.Registerer.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		r.Registerer.Unregister(are.ExistingCollector)
		err = r.Registerer.Register(c)
	}
	return err
}

func (r replacingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Producer produces records to Kafka. It is safe for concurrent use, but
// records are ordered only in the order one goroutine hands them over.
type Producer struct {
	client *kgo.Client
	admin  *kadm.Client
	cfg    config.Kafka
	m      *Metrics
	known  map[string]int // partition count of topics known to exist (0: unknown)
	// sentTo lists the topics records were handed over to, for the
	// watchdog's error when they stall.
	sentTo struct {
		sync.Mutex
		topics []string
	}
	// slots holds one token per record handed to Kafka and not yet
	// acknowledged; Produce blocks on it (backpressure). franz-go's own
	// buffer cap is set above it so that franz-go never blocks: a record
	// handed over must live until Kafka answers or Close fails it, whatever
	// happens to the context of the call that handed it over.
	slots chan struct{}
	// bytes holds the keys, values and headers of those records, up to
	// max_buffered_bytes; Produce blocks on it too.
	bytes    *semaphore.Weighted
	buffered atomic.Int64 // bytes held in bytes
	// fence is the context of every record handed over. The first failure
	// cancels it, so that franz-go fails the records not yet written instead
	// of delivering them ahead of the failed one (per-key order). Its
	// cause is the first failure.
	fence      context.Context
	breakFence context.CancelCauseFunc
	lastAck    atomic.Int64 // unix nanos of the last acknowledgement (or of Watch's start)
	// refused is the last retriable error a broker answered a produce or
	// transaction request with (rejectwatch.go), for the errors of a stall.
	refused       atomic.Pointer[refusal]
	lookupRefused atomic.Pointer[refusal] // a coordinator lookup's (FindCoordinator)
	log           *slog.Logger
	inflight      sync.Pool // of *inflight
	txn           *txnState // exactly_once only (txn.go)
}

// New returns a Producer for cfg. It does not contact the brokers.
//
// franz-go's per-record delivery timeout is off: it counts from the record's
// timestamp, which is the commit time, so a backlog older than the timeout
// would fail at once and forever. Watch enforces kafka.delivery_timeout as a
// stall timeout instead.
//
// first are franz-go options placed ahead of outboxd's own, such as hooks
// (kgo.WithHooks), which then run before outboxd's; where an option sets
// what outboxd sets, outboxd's setting wins.
func New(cfg config.Kafka, m *Metrics, log *slog.Logger, first ...kgo.Opt) (*Producer, error) {
	p := &Producer{cfg: cfg, m: m, log: log, known: map[string]int{}, slots: make(chan struct{}, cfg.MaxBufferedRecords),
		bytes: semaphore.NewWeighted(int64(cfg.MaxBufferedBytes))}
	p.inflight.New = newInflight
	p.fence, p.breakFence = context.WithCancelCause(context.Background())
	p.lastAck.Store(time.Now().UnixNano())
	opts := append(first[:len(first):len(first)],
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(partitioner{kgo.StickyKeyPartitioner(nil)}), // Kafka's murmur2 for keyed records
		kgo.ProducerBatchMaxBytes(int32(cfg.MaxMessageBytes+recordOverhead)),
		kgo.MaxBufferedRecords(cfg.MaxBufferedRecords+1),
		kgo.ProducerLinger(cfg.Linger),
		// A topic outboxd has just created must not wait out franz-go's
		// default 5 s between metadata refreshes: its records would wait
		// for the next refresh to learn the new partitions' leaders.
		kgo.MetadataMinAge(250*time.Millisecond),
		// A new topic's partitions, and a partition whose leader just
		// moved, refuse the first produce with a retriable error for a few
		// tens of milliseconds: retry after 25 ms, not franz-go's 250 ms, and
		// back off to its 5 s as failures go on.
		kgo.RetryBackoffFn(retryBackoff),
		// franz-go fails the records of a partition answered
		// UNKNOWN_TOPIC_OR_PARTITION five times in a row, outside the reject
		// watch, and a later record of that partition could then be sent
		// before the fence breaks. Never failing them leaves a missing topic
		// to the stall watchdog, which names it.
		kgo.UnknownTopicRetries(-1),
		kgo.ProducerBatchCompression(codec(cfg.Compression)),
		kgo.WithLogger(logger{log.With("component", "kafka")}),
		// One kprom per client: it registers on a client's creation and
		// unregisters on its close.
		kgo.WithHooks(kpromClient{kprom.NewMetrics("outboxd", kprom.Subsystem("kafka"), kprom.Registerer(m.reg))}, m, fenceHook{p.fence, p.breakFence}),
		kgo.ProducerOnDataLossDetected(func(topic string, partition int32) {
			log.Error("Kafka reports data loss: acknowledged records are missing from the log (unclean leader election?)",
				"topic", topic, "partition", partition)
		}),
	)
	if cfg.TopicCreation == config.TopicCreationBroker {
		opts = append(opts, kgo.AllowAutoTopicCreation())
	}
	tlsCfg, err := cfg.TLS.Config()
	if err != nil {
		p.breakFence(err)
		return nil, err
	}
	// The fence must break before franz-go acts on a rejection (rejectwatch.go).
	opts = append(opts, kgo.Dialer(dialer(tlsCfg, p.breakFence, p.noteRefusal)))
	if mech := saslMechanism(cfg.SASL); mech != nil {
		opts = append(opts, kgo.SASL(mech))
	}
	client, err := kgo.NewClient(opts...)
	if err != nil {
		p.breakFence(err)
		return nil, fmt.Errorf("creating Kafka client: %w", err)
	}
	p.client, p.admin = client, kadm.NewClient(client)
	return p, nil
}

// fenceHook breaks the fence as soon as franz-go fails a record. After a
// failure franz-go fails every record buffered behind it, up to
// max_buffered_records: only the first builds an error.
type fenceHook struct {
	fence      context.Context
	breakFence context.CancelCauseFunc
}

func (h fenceHook) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	if err != nil && h.fence.Err() == nil {
		h.breakFence(fmt.Errorf("producing to %s[%d]: %w", r.Topic, r.Partition, err))
	}
}

// StallError reports records that Kafka has not acknowledged for
// kafka.delivery_timeout.
type StallError struct {
	InFlight int
	For      time.Duration
	Missing  []string // topics records were sent to that Kafka does not have
	// Partial reports the oldest unconfirmed transaction waiting, while
	// acknowledgements may have come for later records.
	Partial bool
	// Refused is the last error a broker answered a produce or transaction
	// request with during the stall (nil: none answered with one).
	Refused error
	// Down says which brokers a broker still up reported missing, when
	// none refused anything ("": none, or no broker answered).
	Down string
}

func (e *StallError) Error() string {
	d := e.For.Round(time.Second)
	switch {
	case len(e.Missing) > 0:
		// The missing topic is the cause, whether or not other records were acknowledged.
		return fmt.Sprintf("Kafka has not acknowledged records for %s (kafka.delivery_timeout; %d in flight): the topic does not exist: %s; "+
			"create it, enable the brokers' auto.create.topics.enable, or set kafka.topic_creation: admin", d, e.InFlight, strings.Join(e.Missing, ", "))
	case e.Partial && e.Refused != nil:
		return fmt.Sprintf("Kafka has not acknowledged the oldest unconfirmed transaction for %s (kafka.delivery_timeout; %d records in flight): %s",
			d, e.InFlight, explainRefusal(e.Refused))
	case e.Partial:
		return fmt.Sprintf("Kafka has not acknowledged the oldest unconfirmed transaction for %s (kafka.delivery_timeout; %d records in flight); "+
			"a partition without a leader, or without enough in-sync replicas?", d, e.InFlight)
	case e.Refused != nil:
		return fmt.Sprintf("Kafka acknowledged none of %d in-flight records for %s (kafka.delivery_timeout): %s", e.InFlight, d, explainRefusal(e.Refused))
	}
	if e.Down != "" {
		return fmt.Sprintf("Kafka acknowledged none of %d in-flight records for %s (kafka.delivery_timeout); %s", e.InFlight, d, e.Down)
	}
	return fmt.Sprintf("Kafka acknowledged none of %d in-flight records for %s (kafka.delivery_timeout); brokers down or unreachable?", e.InFlight, d)
}

func (e *StallError) Unwrap() error { return e.Refused }

// refusal is a retriable error a broker answered with, and when.
type refusal struct {
	err error
	at  time.Time
}

// noteRefusal keeps err as the last refusal of its kind: a coordinator
// lookup's (FindCoordinator), or a produce or transaction request's.
func (p *Producer) noteRefusal(err error) {
	var lr *lookupRefusal
	last := &p.refused
	if errors.As(err, &lr) {
		last = &p.lookupRefused
	}
	if r := last.Load(); r == nil || r.err.Error() != err.Error() || time.Since(r.at) > 10*time.Second {
		p.log.Debug("a Kafka broker refused a request for now; it is retried", "err", err) // one line a refusal and 10 s at most
	}
	last.Store(&refusal{err: err, at: time.Now()})
}

// refusedSince returns the last retriable error a broker answered a
// produce or transaction request with at or after t, else the last a
// coordinator lookup was answered with at or after t, or nil. A stall is
// explained by what the brokers answered the records first: the client
// looks coordinators up on its own schedule.
func (p *Producer) refusedSince(t time.Time) error {
	for _, last := range []*atomic.Pointer[refusal]{&p.refused, &p.lookupRefused} {
		if r := last.Load(); r != nil && !r.at.Before(t) {
			return r.err
		}
	}
	return nil
}

// explainRefusal says what a broker answered and what to check.
func explainRefusal(err error) string {
	return fmt.Sprintf("a broker %v; %s", err, refusalHint(err))
}

// refusalHint says what to check after a broker answered err.
func refusalHint(err error) string {
	var what string
	switch {
	case errors.Is(err, kerr.NotEnoughReplicas), errors.Is(err, kerr.NotEnoughReplicasAfterAppend):
		what = "fewer replicas of the partition are in sync than its min.insync.replicas, which outboxd's acks=all requires; " +
			"bring the stopped brokers back, and check the partition's ISR (kafka-topics --describe --under-min-isr-partitions)"
	case errors.Is(err, kerr.CoordinatorNotAvailable), errors.Is(err, kerr.NotCoordinator), errors.Is(err, kerr.CoordinatorLoadInProgress):
		// Kafka answers so when __transaction_state's partition has
		// fewer in-sync replicas than transaction.state.log.min.isr (its
		// NOT_ENOUGH_REPLICAS), and while the coordinator moves.
		what = "the transaction coordinator cannot write the transaction log: with brokers down, the __transaction_state partition of " +
			"kafka.transactional_id has fewer replicas in sync than transaction.state.log.min.isr; bring the stopped brokers back, " +
			"and check __transaction_state's ISR (kafka-topics --describe --topic __transaction_state)"
	case errors.Is(err, kerr.NotLeaderForPartition), errors.Is(err, kerr.LeaderNotAvailable), errors.Is(err, kerr.FencedLeaderEpoch),
		errors.Is(err, kerr.UnknownLeaderEpoch):
		what = "the partition has no leader that takes writes; check that the brokers holding its replicas are up"
	case errors.Is(err, kerr.RequestTimedOut):
		what = "the partition's leader timed out waiting for its followers; check the brokers' health and the network between them"
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		what = "the broker does not know the topic or partition; check that it exists"
	default:
		what = "check the brokers' logs"
	}
	return what
}

// timedOut explains err of op when it is a context's deadline: the bound
// that was reached is kafka.delivery_timeout, and what a broker answered
// since start, if anything, says why. Other errors are wrapped as they are.
func (p *Producer) timedOut(op string, start time.Time, err error) error {
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, kgo.ErrRecordTimeout) {
		return fmt.Errorf("%s: %w", op, err)
	}
	if refused := p.refusedSince(start); refused != nil {
		return fmt.Errorf("%s: not done within kafka.delivery_timeout (%s; %w): a broker %w; %s", op, p.cfg.DeliveryTimeout, err, refused, refusalHint(refused))
	}
	if down := p.downBrokers(); down != "" {
		return fmt.Errorf("%s: no answer within kafka.delivery_timeout (%s): %w; %s", op, p.cfg.DeliveryTimeout, err, down)
	}
	return fmt.Errorf("%s: no answer within kafka.delivery_timeout (%s): %w; brokers down or unreachable? check kafka.brokers (%s) and that the brokers are up",
		op, p.cfg.DeliveryTimeout, err, strings.Join(p.cfg.Brokers, ","))
}

// downBrokers asks a broker, for at most 2 s, which brokers hold replicas
// of the topics records went to, or of the transaction log, and are not in
// the cluster, and says so with what follows; "" when none is missing or no broker answers. A broker that is
// up holds acks=all writes (the coordinator's too) until the dead brokers
// drop out of the ISR, and then refuses them: the brokers left answer
// nothing for a while, and "unreachable" would be wrong.
func (p *Producer) downBrokers() string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	p.sentTo.Lock()
	topics := append(slices.Clone(p.sentTo.topics), "__transaction_state")
	p.sentTo.Unlock()
	req := kmsg.NewPtrMetadataRequest()
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, p.client)
	if err != nil || len(resp.Brokers) == 0 {
		return ""
	}
	up := map[int32]bool{}
	var ups []string
	for _, b := range resp.Brokers {
		up[b.NodeID] = true
		ups = append(ups, fmt.Sprint(b.NodeID))
	}
	missing := map[int32]bool{}
	for _, t := range resp.Topics {
		for _, pt := range t.Partitions {
			for _, r := range pt.Replicas {
				if !up[r] {
					missing[r] = true
				}
			}
		}
	}
	if len(missing) == 0 {
		return ""
	}
	var downs []string
	for id := range missing {
		downs = append(downs, fmt.Sprint(id))
	}
	slices.Sort(downs)
	slices.Sort(ups)
	return fmt.Sprintf("brokers %s are down (the cluster lists %s): the brokers left hold writes until the dead ones drop out of the ISR, "+
		"then refuse them under min.insync.replicas (transaction.state.log.min.isr for the transaction coordinator); bring the stopped brokers back",
		strings.Join(downs, ", "), strings.Join(ups, ", "))
}

// Watch returns a *StallError when records have been in flight without any
// acknowledgement for kafka.delivery_timeout, or when waiting (if not nil)
// reports a time longer ago than that: the time since which the oldest
// unconfirmed transaction has had all its records handed over (zero: none
// waits). Acknowledgements of other partitions do not hide a partition that
// stopped alone. It returns nil when ctx is done.
func (p *Producer) Watch(ctx context.Context, waiting func() time.Time) error {
	tick := time.NewTicker(min(time.Second, p.cfg.DeliveryTimeout/4))
	defer tick.Stop()
	// The producer may have been made (and warmed) long before: the stall
	// clock starts now.
	p.lastAck.Store(time.Now().UnixNano())
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		inFlight := len(p.slots)
		if inFlight == 0 {
			p.lastAck.Store(time.Now().UnixNano())
			continue
		}
		last := time.Unix(0, p.lastAck.Load())
		if idle := time.Since(last); idle > p.cfg.DeliveryTimeout {
			se := &StallError{InFlight: inFlight, For: idle, Missing: p.missingTopics(ctx), Refused: p.refusedSince(last)}
			if se.Refused == nil {
				se.Down = p.downBrokers()
			}
			return se
		}
		if waiting == nil {
			continue
		}
		if since := waiting(); !since.IsZero() && time.Since(since) > p.cfg.DeliveryTimeout {
			return &StallError{InFlight: inFlight, For: time.Since(since), Missing: p.missingTopics(ctx), Partial: true, Refused: p.refusedSince(since)}
		}
	}
}

// missingTopics returns the topics of this producer's records that Kafka
// says do not exist, for a stall's error.
func (p *Producer) missingTopics(ctx context.Context) []string {
	p.sentTo.Lock()
	topics := slices.Clone(p.sentTo.topics)
	p.sentTo.Unlock()
	if len(topics) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	td, err := p.admin.ListTopics(ctx, topics...)
	if err != nil {
		return nil
	}
	var missing []string
	for _, t := range topics {
		if d, ok := td[t]; !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			missing = append(missing, t)
		}
	}
	return missing
}

// saslMechanism returns the SASL mechanism of cfg, or nil for none. The
// password is read at every authentication, so a rotated
// kafka.sasl.password_file is picked up by the next connection.
func saslMechanism(cfg config.SASL) sasl.Mechanism {
	switch cfg.Mechanism {
	case config.MechanismPlain:
		return plain.Plain(func(context.Context) (plain.Auth, error) {
			pw, err := cfg.Secret()
			return plain.Auth{User: cfg.Username, Pass: pw}, err
		})
	case config.MechanismScramSHA256, config.MechanismScramSHA512:
		auth := func(context.Context) (scram.Auth, error) {
			pw, err := cfg.Secret()
			return scram.Auth{User: cfg.Username, Pass: pw}, err
		}
		if cfg.Mechanism == config.MechanismScramSHA256 {
			return scram.Sha256(auth)
		}
		return scram.Sha512(auth)
	}
	return nil
}

func codec(c config.Compression) kgo.CompressionCodec {
	switch c {
	case config.CompressionGzip:
		return kgo.GzipCompression()
	case config.CompressionSnappy:
		return kgo.SnappyCompression()
	case config.CompressionLZ4:
		return kgo.Lz4Compression()
	case config.CompressionZstd:
		return kgo.ZstdCompression()
	}
	return kgo.NoCompression()
}

// Ping checks that a broker answers.
func (p *Producer) Ping(ctx context.Context) error {
	if err := p.client.Ping(ctx); err != nil {
		return fmt.Errorf("cannot reach Kafka brokers %s: %w; check kafka.brokers and that the brokers are up",
			strings.Join(p.cfg.Brokers, ","), err)
	}
	return nil
}

// Warm checks that a broker answers and loads the idempotent producer's id,
// so that the first record does not wait for it. A broker that refuses the
// id (an authorization error, for one) fails Warm with the reason; an id
// that cannot be loaded for a passing reason is loaded by the first Produce.
// Call it before the first Produce.
func (p *Producer) Warm(ctx context.Context) error {
	if err := p.Ping(ctx); err != nil {
		return err
	}
	_, _, err := p.client.ProducerID(ctx)
	var ke *kerr.Error
	if err == nil || !errors.As(err, &ke) || ke.Retriable || errors.Is(err, kerr.ConcurrentTransactions) {
		return nil // franz-go tries again on the first Produce
	}
	hint := ""
	if errors.Is(err, kerr.ClusterAuthorizationFailed) {
		hint = "; grant the principal Write on the topics it produces to (or IdempotentWrite on the cluster)"
	}
	return fmt.Errorf("the Kafka brokers %s refused an idempotent producer id: %w%s", strings.Join(p.cfg.Brokers, ","), err, hint)
}

// EnsureTopic creates topic when topic creation is outboxd's job and the
// topic is not known to exist yet. It looks the topic up first: most topics
// exist, and a lookup is one metadata request where a CreateTopics goes to
// the controller, and needs no permission to create topics.
//
// In exactly-once mode with topic_creation: broker, a topic is looked up
// once the way waitUsable does (auto-creation allowed) before its first
// record: a transaction coordinator that does not know a topic the producer
// just had auto-created refuses its partitions, and the transaction aborts
// (OPERATION_NOT_ATTEMPTED).
//
// The lookup, the creation and the wait for leaders together take at most
// kafka.delivery_timeout, as a record's delivery does.
func (p *Producer) EnsureTopic(ctx context.Context, topic string) error {
	if _, ok := p.known[topic]; ok {
		return nil
	}
	if p.cfg.TopicCreation != config.TopicCreationAdmin {
		if p.txn == nil || p.cfg.TopicCreation != config.TopicCreationBroker {
			return nil
		}
		ctx, cancel := context.WithTimeout(ctx, p.cfg.DeliveryTimeout)
		defer cancel()
		n, err := p.waitUsable(ctx, topic)
		if err != nil {
			return err
		}
		p.known[topic] = n
		p.client.ForceMetadataRefresh()
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DeliveryTimeout)
	defer cancel()
	td, err := p.admin.ListTopics(ctx, topic)
	d, found := td[topic]
	found = found && err == nil && d.Err == nil && len(d.Partitions) > 0
	if found && allLed(d.Partitions) {
		p.known[topic] = len(d.Partitions)
		return nil
	}
	if !found {
		resp, err := p.admin.CreateTopic(ctx, int32(p.cfg.TopicPartitions), int16(p.cfg.TopicReplicationFactor), nil, topic)
		if err == nil {
			err = resp.Err
		}
		switch {
		case err == nil:
			p.m.topicsCreated.Inc()
		case errors.Is(err, kerr.TopicAlreadyExists):
		case unreachable(err):
			return fmt.Errorf("creating topic %q: the Kafka brokers %s did not answer within kafka.delivery_timeout (%s): %w; outboxd tries again",
				topic, strings.Join(p.cfg.Brokers, ","), p.cfg.DeliveryTimeout, err)
		case errors.Is(err, kerr.InvalidReplicationFactor):
			// A broker restarting or down: the pipeline restarts until it is back.
			return fmt.Errorf("creating topic %q (%d partitions, replication factor %d): %w; fewer brokers are up than kafka.topic_replication_factor; "+
				"outboxd retries, or lower the setting",
				topic, p.cfg.TopicPartitions, p.cfg.TopicReplicationFactor, err)
		default:
			return fmt.Errorf("creating topic %q (%d partitions, replication factor %d): %w; create it by hand or fix the broker's permissions",
				topic, p.cfg.TopicPartitions, p.cfg.TopicReplicationFactor, err)
		}
	}
	n, err := p.waitUsable(ctx, topic)
	if err != nil {
		return err
	}
	p.known[topic] = n
	p.client.ForceMetadataRefresh() // the producer learns the new topic now, not at its next refresh
	return nil
}

// retryBackoff is franz-go's backoff (doubling to 5 s, ±20 % jitter)
// starting at 25 ms instead of 250 ms.
func retryBackoff(fails int) time.Duration {
	d := 25 * time.Millisecond << min(max(fails-1, 0), 8)
	d = time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
	return min(d, 5*time.Second)
}

// unreachable reports an error of brokers that did not answer, as opposed to
// one they answered with.
func unreachable(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) || kgo.IsRetryableBrokerErr(err)
}

// waitUsable waits until topic can be written to, in a Kafka transaction
// too, and returns its partition count. Every partition must have a leader
// in the metadata of every broker that answers, not only of the first one
// asked: a transaction coordinator that does not know a new topic yet
// refuses to add its partitions to a transaction, and the transaction then
// cannot commit (OPERATION_NOT_ATTEMPTED). And each leader must answer for
// its partitions: a broker learns that it leads a new partition shortly
// after its metadata says so, and answers UNKNOWN_TOPIC_OR_PARTITION until
// then. With topic_creation: broker the lookups allow auto-creation, as the
// producer's own do, so that a topic a record names by partition is created
// as any other. The caller bounds the wait with ctx (kafka.delivery_timeout).
//
// It asks the brokers each time: kadm's lookups answer from franz-go's
// metadata cache for kafka's MetadataMinAge (250 ms here), which held a new
// topic's first record back by that long.
func (p *Producer) waitUsable(ctx context.Context, topic string) (int, error) {
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = p.cfg.TopicCreation == config.TopicCreationBroker
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	var last error // why the topic was not usable yet
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		n, err := p.usable(ctx, req, topic)
		if err == nil {
			return n, nil
		}
		// A lookup cut short by the deadline says nothing new: what the
		// brokers answered before it explains the wait.
		if ctx.Err() == nil || last == nil {
			last = err
		}
		var ke *kerr.Error
		if errors.As(err, &ke) && !ke.Retriable {
			// Refused for good (no ACL to describe or create the topic, an
			// invalid name, a policy): waiting changes nothing.
			return 0, &TopicRefusedError{Topic: topic, Err: err}
		}
		select {
		case <-ctx.Done():
			return 0, p.notUsable(topic, last, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// usable returns the partition count of topic if every broker that answers
// knows it with a leader for every partition and each leader answers for its
// partitions, and what is not so otherwise.
func (p *Producer) usable(ctx context.Context, req *kmsg.MetadataRequest, topic string) (int, error) {
	resp, err := req.RequestWith(ctx, p.client)
	if err != nil {
		return 0, err
	}
	t, err := ledTopic(resp, topic)
	if err != nil {
		return 0, err
	}
	// The other brokers, each asked directly. One that does not answer
	// (down, and not yet fenced by the controllers) is skipped: it can
	// coordinate no transaction and lead no partition.
	for _, b := range resp.Brokers {
		bctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		bresp, err := req.RequestWith(bctx, p.client.Broker(int(b.NodeID)))
		cancel()
		if err != nil {
			continue
		}
		if _, err := ledTopic(bresp, topic); err != nil {
			return 0, fmt.Errorf("broker %d does not know the topic's leaders yet (%w)", b.NodeID, err)
		}
	}
	// Each leader, asked for its partitions' start offsets.
	byLeader := map[int32]*kmsg.ListOffsetsRequest{}
	for _, pt := range t.Partitions {
		lreq := byLeader[pt.Leader]
		if lreq == nil {
			lreq = kmsg.NewPtrListOffsetsRequest()
			lreq.ReplicaID = -1
			lt := kmsg.NewListOffsetsRequestTopic()
			lt.Topic = topic
			lreq.Topics = append(lreq.Topics, lt)
			byLeader[pt.Leader] = lreq
		}
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition, lp.Timestamp, lp.CurrentLeaderEpoch = pt.Partition, -2, -1 // -2: the start
		lreq.Topics[0].Partitions = append(lreq.Topics[0].Partitions, lp)
	}
	for leader, lreq := range byLeader {
		lresp, err := lreq.RequestWith(ctx, p.client.Broker(int(leader)))
		if err != nil {
			return 0, fmt.Errorf("broker %d, the leader of partitions of %s: %w", leader, topic, err)
		}
		for _, lt := range lresp.Topics {
			for _, lp := range lt.Partitions {
				if err := kerr.ErrorForCode(lp.ErrorCode); err != nil {
					return 0, fmt.Errorf("broker %d does not answer for %s[%d], which it leads, yet (%w)", leader, topic, lp.Partition, err)
				}
			}
		}
	}
	return len(t.Partitions), nil
}

// ledTopic returns topic from a metadata response when it has partitions,
// each with a leader.
func ledTopic(resp *kmsg.MetadataResponse, topic string) (kmsg.MetadataResponseTopic, error) {
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return t, err
		}
		if len(t.Partitions) == 0 {
			return t, errNoPartitions
		}
		for _, pt := range t.Partitions {
			if err := kerr.ErrorForCode(pt.ErrorCode); err != nil {
				return t, fmt.Errorf("partition %d: %w", pt.Partition, err)
			}
			if pt.Leader < 0 {
				return t, fmt.Errorf("partition %d: %w", pt.Partition, errNoLeader)
			}
		}
		return t, nil
	}
	return kmsg.MetadataResponseTopic{}, kerr.UnknownTopicOrPartition
}

// TopicRefusedError is a topic the brokers refused to describe or create
// with an error that does not go away by itself (TOPIC_AUTHORIZATION_FAILED,
// INVALID_TOPIC_EXCEPTION, POLICY_VIOLATION, ...). It is permanent: outboxd
// stops, as it does when Kafka rejects a record, instead of retrying.
type TopicRefusedError struct {
	Topic string
	Err   error
}

func (e *TopicRefusedError) Error() string {
	return fmt.Sprintf("the brokers refused topic %q: %v", e.Topic, e.Err)
}

// Hint says what to do.
func (e *TopicRefusedError) Hint() string {
	return "grant outboxd's principal Describe and Create on the topic (or create it and grant Describe and Write), or fix the topic name the row routes to"
}

func (e *TopicRefusedError) Unwrap() error { return e.Err }

// Permanent reports that retrying cannot help.
func (e *TopicRefusedError) Permanent() bool { return true }

var (
	errNoPartitions = errors.New("no partitions")
	errNoLeader     = errors.New("no leader")
)

// notUsable is the error of a topic that was not usable within the bound:
// what the brokers said last, and what to do.
func (p *Producer) notUsable(topic string, last, cause error) error {
	bound := p.cfg.DeliveryTimeout
	switch {
	case errors.Is(last, kerr.UnknownTopicOrPartition) && p.cfg.TopicCreation == config.TopicCreationBroker:
		return fmt.Errorf("topic %q does not exist and the brokers did not create it within kafka.delivery_timeout (%s): %w; "+
			"create it, enable the brokers' auto.create.topics.enable, or set kafka.topic_creation: admin", topic, bound, last)
	case errors.Is(last, kerr.UnknownTopicOrPartition):
		return fmt.Errorf("topic %q does not exist (%w) after kafka.delivery_timeout (%s); create it, or set kafka.topic_creation: admin", topic, last, bound)
	case unreachable(last):
		return fmt.Errorf("looking up topic %q: the Kafka brokers %s did not answer within kafka.delivery_timeout (%s): %w; outboxd tries again",
			topic, strings.Join(p.cfg.Brokers, ","), bound, last)
	}
	return fmt.Errorf("topic %q is not usable yet after kafka.delivery_timeout (%s): %w (%w); check that the brokers holding its partitions are up; outboxd tries again",
		topic, bound, last, cause)
}

// partitions returns the partition count of topic, asking Kafka once, for
// records whose partition a column chose. Bounded by kafka.delivery_timeout.
func (p *Producer) partitions(ctx context.Context, topic string) (int, error) {
	if n := p.known[topic]; n > 0 {
		return n, nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DeliveryTimeout)
	defer cancel()
	n, err := p.waitUsable(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("reading the partitions of topic %q: %w", topic, err)
	}
	p.known[topic] = n
	return n, nil
}

func allLed(ps kadm.PartitionDetails) bool {
	for _, pd := range ps {
		if pd.Leader < 0 || pd.Err != nil {
			return false
		}
	}
	return true
}

// Fill returns how full the in-flight caps are: the larger of in-flight
// records over max_buffered_records and their bytes over max_buffered_bytes.
// At 1, Produce blocks and outboxd stops reading WAL.
func (p *Producer) Fill() float64 {
	return max(float64(len(p.slots))/float64(p.cfg.MaxBufferedRecords),
		float64(p.buffered.Load())/float64(p.cfg.MaxBufferedBytes))
}

// Produce hands rec to Kafka and calls done once with the outcome, from
// another goroutine. It blocks while max_buffered_records, or records of
// max_buffered_bytes, are unacknowledged.
// It returns an error only when the record could not be handed over at all
// (ctx done, topic creation failed); done is then never called. Once handed
// over, a record is delivered or failed whatever happens to ctx.
// Produce keeps no reference to rec itself, so the caller may reuse it once
// Produce returns; the bytes of its key, value and headers must stay
// unchanged until done is called.
func (p *Producer) Produce(ctx context.Context, rec *router.Record, done func(error)) error {
	if _, ok := p.known[rec.Topic]; !ok {
		if err := p.EnsureTopic(ctx, rec.Topic); err != nil {
			return err
		}
		if _, ok := p.known[rec.Topic]; !ok {
			p.known[rec.Topic] = 0 // the broker creates it, or not; the partition count is not known
		}
		p.sentTo.Lock()
		p.sentTo.topics = append(p.sentTo.topics, rec.Topic)
		p.sentTo.Unlock()
	}
	size := rec.Size()
	if size > p.cfg.MaxMessageBytes {
		return &router.RowError{EventID: rec.EventID, Topic: rec.Topic, Key: rec.Key, Value: rec.Value,
			Reason: fmt.Sprintf("the record is %d bytes, over kafka.max_message_bytes (%d); send large payloads by reference", size, p.cfg.MaxMessageBytes)}
	}
	rctx := p.fence
	if rec.Partition >= 0 {
		n, err := p.partitions(ctx, rec.Topic)
		if err != nil {
			return err
		}
		if int(rec.Partition) >= n {
			return &router.RowError{EventID: rec.EventID, Topic: rec.Topic, Key: rec.Key, Value: rec.Value,
				Reason: fmt.Sprintf("partition %d chosen by its partition column does not exist: topic %s has %d partitions", rec.Partition, rec.Topic, n)}
		}
		rctx = context.WithValue(p.fence, partitionKey{}, rec.Partition)
	}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	weight := int64(min(size, p.cfg.MaxBufferedBytes)) // a record over the cap goes alone
	if err := p.bytes.Acquire(ctx, weight); err != nil {
		<-p.slots
		return err
	}
	p.buffered.Add(weight)
	if p.fence.Err() != nil {
		p.unbuffer(weight)
		return &NotHandedOverError{EventID: rec.EventID, Err: context.Cause(p.fence)}
	}
	f := p.inflight.Get().(*inflight)
	f.p, f.eventID, f.commitTime, f.done, f.weight = p, rec.EventID, rec.CommitTime, done, weight
	f.kr = kgo.Record{Topic: rec.Topic, Key: rec.Key, Value: rec.Value, Timestamp: rec.Timestamp, Context: rctx}
	if len(rec.Headers) <= len(f.headers) {
		f.kr.Headers = f.headers[:len(rec.Headers)]
	} else {
		f.kr.Headers = make([]kgo.RecordHeader, len(rec.Headers))
	}
	for i, h := range rec.Headers {
		f.kr.Headers[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	p.client.Produce(rctx, &f.kr, f.promise)
	return nil
}

// inflight is a record handed to franz-go: the record, room for its headers
// and its promise, in one reused allocation.
type inflight struct {
	kr         kgo.Record
	headers    [4]kgo.RecordHeader
	promise    func(*kgo.Record, error) // f.finish, bound once
	p          *Producer
	eventID    string
	commitTime time.Time
	done       func(error)
	weight     int64 // its share of max_buffered_bytes
}

func newInflight() any {
	f := &inflight{}
	f.promise = f.finish
	return f
}

// finish is the record's promise. franz-go does not touch the record once
// it returns, so the inflight goes back to the pool.
func (f *inflight) finish(r *kgo.Record, err error) {
	p, done := f.p, f.done
	p.unbuffer(f.weight)
	if err != nil {
		p.breakFence(err)
		p.m.errors.WithLabelValues(errorKind(err)).Inc()
		de := &DeliveryError{Topic: r.Topic, Partition: r.Partition, EventID: f.eventID, Err: err}
		f.release()
		done(de)
		return
	}
	now := time.Now() // one clock read per record: this runs for every record
	p.lastAck.Store(now.UnixNano())
	c := p.m.forTopic(r.Topic)
	c.records.Inc()
	c.bytes.Add(float64(len(r.Key) + len(r.Value)))
	if !f.commitTime.IsZero() {
		p.m.commitToAck.Observe(now.Sub(f.commitTime).Seconds())
	}
	f.release()
	done(nil)
}

func (f *inflight) release() {
	p := f.p
	f.kr, f.headers, f.p, f.eventID, f.commitTime, f.done, f.weight = kgo.Record{}, [4]kgo.RecordHeader{}, nil, "", time.Time{}, nil, 0
	p.inflight.Put(f)
}

// unbuffer gives back a record's slot and bytes.
func (p *Producer) unbuffer(weight int64) {
	p.buffered.Add(-weight)
	p.bytes.Release(weight)
	<-p.slots
}

// recordOverhead is room for a record's framing in a batch.
const recordOverhead = 1024

// partitionKey marks a record whose partition a column chose.
type partitionKey struct{}

// partitioner uses the partition a column chose, and Kafka's murmur2 of the
// key otherwise.
type partitioner struct{ keyed kgo.Partitioner }

func (p partitioner) ForTopic(topic string) kgo.TopicPartitioner {
	return topicPartitioner{p.keyed.ForTopic(topic)}
}

type topicPartitioner struct{ keyed kgo.TopicPartitioner }

func chosen(r *kgo.Record) (int32, bool) {
	if r.Context == nil {
		return 0, false
	}
	p, ok := r.Context.Value(partitionKey{}).(int32)
	return p, ok
}

func (tp topicPartitioner) RequiresConsistency(r *kgo.Record) bool {
	_, ok := chosen(r)
	return ok || tp.keyed.RequiresConsistency(r)
}

func (tp topicPartitioner) Partition(r *kgo.Record, n int) int {
	if p, ok := chosen(r); ok {
		return int(p)
	}
	return tp.keyed.Partition(r, n)
}

// OnNewBatch keeps the sticky partitioning of records without a key.
func (tp topicPartitioner) OnNewBatch() {
	if nb, ok := tp.keyed.(kgo.TopicPartitionerOnNewBatch); ok {
		nb.OnNewBatch()
	}
}

// NotHandedOverError is Produce's error for a record it did not hand over
// because an earlier record of the producer failed (Err): the record itself
// may be sound, and a new producer may deliver it.
type NotHandedOverError struct {
	EventID string
	Err     error // the earlier failure
}

func (e *NotHandedOverError) Error() string {
	return fmt.Sprintf("not handing over event %s: an earlier record failed: %v", e.EventID, e.Err)
}

func (e *NotHandedOverError) Unwrap() error { return e.Err }

// DeliveryError reports a record Kafka did not acknowledge.
type DeliveryError struct {
	Topic     string
	Partition int32
	EventID   string
	Err       error
}

// Rejected reports whether Kafka refused the record itself (its content or
// size), so that sending it again would fail again: outboxd halts on it
// like on a poison row instead of restarting forever.
func (e *DeliveryError) Rejected() bool {
	var ke *kerr.Error
	if !errors.As(e.Err, &ke) {
		return false
	}
	switch ke {
	case kerr.InvalidRecord, kerr.CorruptMessage, kerr.MessageTooLarge, kerr.RecordListTooLarge,
		kerr.InvalidTimestamp, kerr.UnsupportedForMessageFormat, kerr.UnsupportedCompressionType:
		return true
	}
	return false
}

func (e *DeliveryError) Error() string {
	return fmt.Sprintf("delivering event %s to topic %s: %v", e.EventID, e.Topic, e.Err)
}

// Permanent reports a record Kafka rejected (Rejected): sending it again
// after a restart would fail again.
func (e *DeliveryError) Permanent() bool { return e.Rejected() }

// Hint says what to do about a rejected record, "" for any other failure,
// which a restart retries.
func (e *DeliveryError) Hint() string {
	if !e.Rejected() {
		return ""
	}
	return "Kafka will refuse the record again, so outboxd stopped without confirming past it; fix the record or the topic's configuration and restart"
}

func (e *DeliveryError) Unwrap() error { return e.Err }

// Close fails every record still buffered and closes the client.
func (p *Producer) Close() {
	p.breakFence(errClosed)
	p.client.Close()
}

// errClosed is the fence's cause after Close.
var errClosed = errors.New("the Kafka producer was closed")

// logger sends franz-go's log lines to slog.
type logger struct{ l *slog.Logger }

func (logger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (l logger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	// franz-go's errors are retried faults or surface again as the error
	// that stops outboxd, which the top level logs at Error: Warn here.
	lv := slog.LevelInfo
	switch level {
	case kgo.LogLevelError, kgo.LogLevelWarn:
		lv = slog.LevelWarn
	case kgo.LogLevelDebug:
		lv = slog.LevelDebug
	}
	l.l.Log(context.Background(), lv, msg, keyvals...)
}
