package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"
)

// Handler applies one record's effects in tx. It must not commit or roll
// back tx.
type Handler func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error

// DB is the database the Consumer records processed events in;
// *pgxpool.Pool satisfies it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Config configures a Consumer.
type Config struct {
	Brokers []string
	Group   string   // consumer group id
	Topics  []string // topics to consume
	// Name keys this consumer's rows in the processed-events table; ""
	// means Group. Two groups with one Name share their deduplication.
	Name string
	// DeadLetterTopic receives records that failed MaxAttempts times.
	DeadLetterTopic string
	// Table is the processed-events table, schema-qualified; "" is
	// public.processed_events.
	Table    string
	IDHeader string // "" is "id", outboxd's default
	// MaxAttempts is how often a record is tried before it is dead-lettered
	// (0: 5). Backoff is the first wait between attempts (0: 100ms); it
	// doubles up to MaxBackoff (0: 5s).
	MaxAttempts int
	Backoff     time.Duration
	MaxBackoff  time.Duration
	// MaxPollRecords bounds the records handled between offset commits
	// (0: 100).
	MaxPollRecords int
	// Retention, if positive, makes Run delete this consumer's
	// processed-events rows older than Retention every RetentionInterval
	// (0: 1h). See the package documentation before choosing it.
	Retention         time.Duration
	RetentionInterval time.Duration
	// KafkaOpts are added to the client's options (TLS, SASL, ...).
	KafkaOpts []kgo.Opt
	Logger    *slog.Logger          // nil: no logs
	Metrics   prometheus.Registerer // nil: no metrics
}

// Header keys added to dead-lettered records.
const (
	HeaderError     = "dlt.error"
	HeaderAttempts  = "dlt.attempts"
	HeaderTopic     = "dlt.topic"
	HeaderPartition = "dlt.partition"
	HeaderOffset    = "dlt.offset"
	HeaderConsumer  = "dlt.consumer"
)

// ErrNoEventID is the dead-letter reason of a record without an id header.
var ErrNoEventID = errors.New("record has no event id header")

// Consumer consumes records with a Handler; see the package documentation.
type Consumer struct {
	cfg    Config
	db     DB
	h      Handler
	cl     *kgo.Client
	log    *slog.Logger
	m      *metrics
	insert string // records an event id
	prune  string // deletes rows older than $2

	// crashAfterCommit, set by tests, simulates a crash after a record's
	// transaction committed: Run returns errCrashed at once, committing no
	// offsets.
	crashAfterCommit func(*kgo.Record) bool

	ran atomic.Bool // Run was called
}

var errCrashed = errors.New("simulated crash")

// New returns a Consumer of cfg.Topics in cfg.Group that applies records
// with h and records them in db. It joins the group when Run first polls.
func New(cfg Config, db DB, h Handler) (*Consumer, error) {
	switch {
	case len(cfg.Brokers) == 0:
		return nil, errors.New("consumer: Config.Brokers is empty")
	case cfg.Group == "":
		return nil, errors.New("consumer: Config.Group is empty; name the consumer group")
	case len(cfg.Topics) == 0:
		return nil, errors.New("consumer: Config.Topics is empty")
	case cfg.DeadLetterTopic == "":
		return nil, errors.New("consumer: Config.DeadLetterTopic is empty; records that keep failing need somewhere to go")
	case db == nil || h == nil:
		return nil, errors.New("consumer: New needs a database and a handler")
	}
	if cfg.Name == "" {
		cfg.Name = cfg.Group
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.IDHeader == "" {
		cfg.IDHeader = "id"
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	if cfg.MaxPollRecords <= 0 {
		cfg.MaxPollRecords = 100
	}
	if cfg.RetentionInterval <= 0 {
		cfg.RetentionInterval = time.Hour
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	}, cfg.KafkaOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("consumer: creating Kafka client: %w", err)
	}
	table := quoteTable(cfg.Table)
	return &Consumer{
		cfg: cfg, db: db, h: h, cl: cl, m: newMetrics(cfg.Metrics),
		log:    log.With("group", cfg.Group, "consumer", cfg.Name),
		insert: "INSERT INTO " + table + " (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
		prune: "DELETE FROM " + table + " WHERE ctid IN (SELECT ctid FROM " + table +
			" WHERE consumer = $1 AND processed_at < $2 LIMIT 10000)",
	}, nil
}

// Close leaves the group and closes the Kafka client; call it after Run
// returned. Offsets of records not yet committed by Run are not committed.
func (c *Consumer) Close() { c.cl.Close() }

// Run consumes until ctx is done (it returns nil) or a record can neither be
// applied nor dead-lettered, or the database fails (it returns the error).
// Run may be called once: the Kafka client keeps its fetch position past
// records that the last poll returned but Run did not apply, so a second Run
// would skip them and then commit past them. To go on after Run returned,
// Close the Consumer and create a new one, which resumes from the committed
// offsets.
func (c *Consumer) Run(ctx context.Context) error {
	if c.ran.Swap(true) {
		return errors.New("consumer: Run may be called once, and it was; Close this Consumer and create a new one, which resumes from the committed offsets (a second Run would skip the records the first left unapplied)")
	}
	if err := c.checkDeadLetterTopic(ctx); err != nil {
		c.ran.Store(false) // nothing was polled: Run may try again
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	if c.cfg.Retention > 0 {
		g.Go(func() error {
			c.pruneEvery(ctx)
			return nil
		})
	}
	g.Go(func() error { return c.consume(ctx) })
	return g.Wait()
}

func (c *Consumer) consume(ctx context.Context) error {
	for {
		fs := c.cl.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fs.IsClientClosed() {
			return errors.New("consumer: Kafka client closed while running")
		}
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				c.log.Warn("fetching records", "topic", topic, "partition", p, "err", err)
			}
		})
		recs := fs.Records()
		handled := 0
		var err error
		for _, r := range recs {
			if err = c.handle(ctx, r); err != nil {
				break
			}
			handled++
		}
		if errors.Is(err, errCrashed) {
			c.cl.AllowRebalance() // so that Close can leave the group
			return err
		}
		if cerr := c.commit(ctx, recs[:handled]); cerr != nil && err == nil {
			err = cerr
		}
		c.cl.AllowRebalance()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// checkDeadLetterTopic fails early when the dead-letter topic is missing
// and the client may not create it, rather than when a record first needs it.
func (c *Consumer) checkDeadLetterTopic(ctx context.Context) error {
	if auto, _ := c.cl.OptValue(kgo.AllowAutoTopicCreation).(bool); auto {
		return nil
	}
	// A topic created a moment ago may not be in every broker's metadata yet.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	adm := kadm.NewClient(c.cl)
	for {
		topics, err := adm.ListTopics(ctx, c.cfg.DeadLetterTopic)
		if t, ok := topics[c.cfg.DeadLetterTopic]; err == nil && ok && t.Err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("consumer: looking up dead-letter topic %s: %w", c.cfg.DeadLetterTopic, err)
			}
			return fmt.Errorf("consumer: dead-letter topic %s does not exist; create it, or pass kgo.AllowAutoTopicCreation() in Config.KafkaOpts if the brokers auto-create topics", c.cfg.DeadLetterTopic)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// commit commits the offsets of handled records; after ctx is done it gets
// a short deadline of its own.
func (c *Consumer) commit(ctx context.Context, recs []*kgo.Record) error {
	if len(recs) == 0 {
		return nil
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
	}
	if err := c.cl.CommitRecords(ctx, recs...); err != nil {
		return fmt.Errorf("consumer: committing offsets of %d records: %w", len(recs), err)
	}
	return nil
}

// dbError marks a failure of the database rather than of the record.
type dbError struct{ err error }

func (e *dbError) Error() string { return e.err.Error() }
func (e *dbError) Unwrap() error { return e.err }

// handle applies r, retrying and finally dead-lettering it; it returns an
// error only when r is neither applied nor dead-lettered.
func (c *Consumer) handle(ctx context.Context, r *kgo.Record) error {
	id := ""
	for _, h := range r.Headers {
		if h.Key == c.cfg.IDHeader {
			id = string(h.Value)
		}
	}
	if id == "" {
		return c.deadLetter(ctx, r, 0, fmt.Errorf("%w %q", ErrNoEventID, c.cfg.IDHeader))
	}
	wait := c.cfg.Backoff
	for attempt := 1; ; attempt++ {
		applied, err := c.apply(ctx, id, r)
		if err == nil {
			if applied {
				c.m.records.WithLabelValues("applied").Inc()
				if c.crashAfterCommit != nil && c.crashAfterCommit(r) {
					return errCrashed
				}
			} else {
				c.m.records.WithLabelValues("duplicate").Inc()
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var dbErr *dbError
		if attempt >= c.cfg.MaxAttempts {
			if errors.As(err, &dbErr) {
				return fmt.Errorf("consumer: recording event %s from %s/%d@%d: %w", id, r.Topic, r.Partition, r.Offset, err)
			}
			return c.deadLetter(ctx, r, attempt, err)
		}
		c.m.retries.Inc()
		c.log.Warn("handling record failed; retrying", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
			"attempt", attempt, "retry_in", wait, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, c.cfg.MaxBackoff)
	}
}

// apply runs the handler for event id in a transaction that records the id;
// applied is false when the id was recorded before.
func (c *Consumer) apply(ctx context.Context, id string, r *kgo.Record) (applied bool, err error) {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return false, &dbError{fmt.Errorf("beginning transaction: %w", err)}
	}
	defer func() { _ = tx.Rollback(ctx) }() // no-op after Commit
	tag, err := tx.Exec(ctx, c.insert, c.cfg.Name, id)
	if err != nil {
		return false, &dbError{fmt.Errorf("recording event id in %s: %w", c.cfg.Table, err)}
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	if err := c.h(ctx, tx, r); err != nil {
		return false, fmt.Errorf("handler: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("committing: %w", err)
	}
	return true, nil
}

func (c *Consumer) deadLetter(ctx context.Context, r *kgo.Record, attempts int, cause error) error {
	dl := &kgo.Record{
		Topic: c.cfg.DeadLetterTopic, Key: r.Key, Value: r.Value,
		Headers: append(append([]kgo.RecordHeader(nil), r.Headers...),
			kgo.RecordHeader{Key: HeaderError, Value: []byte(cause.Error())},
			kgo.RecordHeader{Key: HeaderAttempts, Value: []byte(strconv.Itoa(attempts))},
			kgo.RecordHeader{Key: HeaderTopic, Value: []byte(r.Topic)},
			kgo.RecordHeader{Key: HeaderPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
			kgo.RecordHeader{Key: HeaderOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
			kgo.RecordHeader{Key: HeaderConsumer, Value: []byte(c.cfg.Name)},
		),
	}
	if err := c.cl.ProduceSync(ctx, dl).FirstErr(); err != nil {
		return fmt.Errorf("consumer: dead-lettering %s/%d@%d to %s: %w (the record failed with: %v)",
			r.Topic, r.Partition, r.Offset, c.cfg.DeadLetterTopic, err, cause)
	}
	c.m.records.WithLabelValues("dead_lettered").Inc()
	c.log.Warn("record dead-lettered", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
		"dead_letter_topic", c.cfg.DeadLetterTopic, "attempts", attempts, "err", cause)
	return nil
}

// Prune deletes this consumer's processed-events rows older than before, in
// batches, and returns how many it deleted.
func (c *Consumer) Prune(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	for {
		tag, err := c.db.Exec(ctx, c.prune, c.cfg.Name, before)
		if err != nil {
			return total, fmt.Errorf("consumer: pruning %s before %s: %w", c.cfg.Table, before.Format(time.RFC3339), err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 10000 {
			return total, nil
		}
	}
}

func (c *Consumer) pruneEvery(ctx context.Context) {
	t := time.NewTicker(c.cfg.RetentionInterval)
	defer t.Stop()
	for {
		n, err := c.Prune(ctx, time.Now().Add(-c.cfg.Retention))
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			c.log.Warn("pruning processed events failed; retrying at the next interval", "err", err)
		default:
			c.m.pruned.Add(float64(n))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// DefaultTable is the processed-events table used when Config.Table is "".
const DefaultTable = "public.processed_events"

func quoteTable(table string) string {
	schema, name, ok := strings.Cut(table, ".")
	if !ok {
		schema, name = "public", table
	}
	return pgx.Identifier{schema, name}.Sanitize()
}

// CreateTable creates the processed-events table (schema-qualified; ""
// is DefaultTable) and its index if they do not exist.
func CreateTable(ctx context.Context, db DB, table string) error {
	if table == "" {
		table = DefaultTable
	}
	if _, err := db.Exec(ctx, TableSQL(table)); err != nil {
		return fmt.Errorf("creating processed-events table %s: %w", table, err)
	}
	return nil
}

// TableSQL returns the DDL of the processed-events table, for migration
// tools.
func TableSQL(table string) string {
	_, name, ok := strings.Cut(table, ".")
	if !ok {
		name = table
	}
	q := quoteTable(table)
	return "CREATE TABLE IF NOT EXISTS " + q + ` (
    consumer     text        NOT NULL,
    event_id     text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX IF NOT EXISTS ` + pgx.Identifier{name + "_processed_at_idx"}.Sanitize() + " ON " + q + " (processed_at);"
}

type metrics struct {
	records *prometheus.CounterVec
	retries prometheus.Counter
	pruned  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_consumer_records_total",
			Help: "Records handled, by result: applied, duplicate (skipped) or dead_lettered.",
		}, []string{"result"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_consumer_retries_total",
			Help: "Failed attempts at a record that were retried.",
		}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_consumer_pruned_total",
			Help: "Processed-events rows deleted by retention.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.records, m.retries, m.pruned)
	}
	return m
}
