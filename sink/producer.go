package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
)

// Metrics are the sink's Prometheus metrics. They outlive Producers, which
// are replaced on every pipeline restart.
type Metrics struct {
	produced      prometheus.Counter
	producedBytes prometheus.Counter
	errors        prometheus.Counter
	topicsCreated prometheus.Counter
}

// NewMetrics registers the sink's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		produced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_sink_records_produced_total", Help: "Records acknowledged by Kafka.",
		}),
		producedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_sink_produced_bytes_total", Help: "Key and value bytes of records acknowledged by Kafka.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_sink_produce_errors_total", Help: "Records that failed to be delivered (each stops and restarts the pipeline).",
		}),
		topicsCreated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_sink_topics_created_total", Help: "Topics created by outboxd.",
		}),
	}
	reg.MustRegister(m.produced, m.producedBytes, m.errors, m.topicsCreated)
	return m
}

// Producer produces records to Kafka. It is safe for concurrent use, but
// records are ordered only in the order one goroutine hands them over.
type Producer struct {
	client *kgo.Client
	admin  *kadm.Client
	cfg    config.Kafka
	m      *Metrics
	known  map[string]bool // topics known to exist
	// slots holds one token per record handed to Kafka and not yet
	// acknowledged; Produce blocks on it (backpressure). franz-go's own
	// buffer cap is set above it so that franz-go never blocks: a record
	// handed over must live until Kafka answers or Close fails it, whatever
	// happens to the context of the call that handed it over.
	slots chan struct{}
}

// New returns a Producer for cfg. It does not contact the brokers.
func New(cfg config.Kafka, m *Metrics, log *slog.Logger) (*Producer, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), // Kafka's murmur2 for keyed records
		kgo.MaxBufferedRecords(cfg.MaxBufferedRecords + 1),
		kgo.RecordDeliveryTimeout(cfg.DeliveryTimeout),
		kgo.ProducerLinger(cfg.Linger),
		kgo.ProducerBatchCompression(codec(cfg.Compression)),
		kgo.WithLogger(logger{log.With("component", "kafka")}),
		kgo.ProducerOnDataLossDetected(func(topic string, partition int32) {
			log.Error("Kafka reports data loss: acknowledged records are missing from the log (unclean leader election?)",
				"topic", topic, "partition", partition)
		}),
	}
	if cfg.TopicCreation == "broker" {
		opts = append(opts, kgo.AllowAutoTopicCreation())
	}
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("creating Kafka client: %w", err)
	}
	return &Producer{
		client: client, admin: kadm.NewClient(client), cfg: cfg, m: m,
		known: map[string]bool{}, slots: make(chan struct{}, cfg.MaxBufferedRecords),
	}, nil
}

func codec(name string) kgo.CompressionCodec {
	switch name {
	case "gzip":
		return kgo.GzipCompression()
	case "snappy":
		return kgo.SnappyCompression()
	case "lz4":
		return kgo.Lz4Compression()
	case "zstd":
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

// EnsureTopic creates topic when topic creation is outboxd's job and the
// topic is not known to exist yet.
func (p *Producer) EnsureTopic(ctx context.Context, topic string) error {
	if p.known[topic] || p.cfg.TopicCreation != "admin" {
		return nil
	}
	resp, err := p.admin.CreateTopic(ctx, int32(p.cfg.TopicPartitions), int16(p.cfg.TopicReplicationFactor), nil, topic)
	if err == nil {
		err = resp.Err
	}
	switch {
	case err == nil:
		p.m.topicsCreated.Inc()
	case errors.Is(err, kerr.TopicAlreadyExists):
	default:
		return fmt.Errorf("creating topic %q (%d partitions, replication factor %d): %w; create it by hand or fix the broker's permissions",
			topic, p.cfg.TopicPartitions, p.cfg.TopicReplicationFactor, err)
	}
	if err := p.waitLeaders(ctx, topic); err != nil {
		return err
	}
	p.known[topic] = true
	return nil
}

// waitLeaders waits until every partition of a new topic has a leader, so
// that the first records do not fail as sent to an unknown topic.
func (p *Producer) waitLeaders(ctx context.Context, topic string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		td, err := p.admin.ListTopics(ctx, topic)
		if err == nil {
			if d, ok := td[topic]; ok && d.Err == nil && len(d.Partitions) > 0 && allLed(d.Partitions) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %q was created but its partitions have no leader yet: %w", topic, ctx.Err())
		case <-time.After(delay):
		}
	}
}

func allLed(ps kadm.PartitionDetails) bool {
	for _, pd := range ps {
		if pd.Leader < 0 || pd.Err != nil {
			return false
		}
	}
	return true
}

// Produce hands rec to Kafka and calls done once with the outcome, from
// another goroutine. It blocks while max_buffered_records are unacknowledged.
// It returns an error only when the record could not be handed over at all
// (ctx done, topic creation failed); done is then never called. Once handed
// over, a record is delivered or failed whatever happens to ctx.
func (p *Producer) Produce(ctx context.Context, rec *router.Record, done func(error)) error {
	if err := p.EnsureTopic(ctx, rec.Topic); err != nil {
		return err
	}
	kr := &kgo.Record{Topic: rec.Topic, Key: rec.Key, Value: rec.Value, Headers: make([]kgo.RecordHeader, len(rec.Headers))}
	for i, h := range rec.Headers {
		kr.Headers[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.client.Produce(context.Background(), kr, func(r *kgo.Record, err error) {
		<-p.slots
		if err != nil {
			p.m.errors.Inc()
			done(&DeliveryError{Topic: r.Topic, Partition: r.Partition, EventID: rec.EventID, Err: err})
			return
		}
		p.m.produced.Inc()
		p.m.producedBytes.Add(float64(len(r.Key) + len(r.Value)))
		done(nil)
	})
	return nil
}

// DeliveryError reports a record Kafka did not acknowledge.
type DeliveryError struct {
	Topic     string
	Partition int32
	EventID   string
	Err       error
}

func (e *DeliveryError) Error() string {
	hint := ""
	if errors.Is(e.Err, kerr.UnknownTopicOrPartition) {
		hint = "; the topic does not exist: create it, enable the broker's auto.create.topics.enable, or set kafka.topic_creation: admin"
	}
	return fmt.Sprintf("delivering event %s to topic %s: %v%s", e.EventID, e.Topic, e.Err, hint)
}

func (e *DeliveryError) Unwrap() error { return e.Err }

// Close fails every record still buffered and closes the client.
func (p *Producer) Close() { p.client.Close() }

// logger sends franz-go's log lines to slog.
type logger struct{ l *slog.Logger }

func (logger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (l logger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelInfo
	switch level {
	case kgo.LogLevelError:
		lv = slog.LevelError
	case kgo.LogLevelWarn:
		lv = slog.LevelWarn
	case kgo.LogLevelDebug:
		lv = slog.LevelDebug
	}
	l.l.Log(context.Background(), lv, msg, keyvals...)
}
