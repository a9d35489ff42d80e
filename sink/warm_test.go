package sink_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// counter counts the requests of one kind that c receives, without
// answering them itself.
func counter(c *kfake.Cluster, key kmsg.Key) *atomic.Int64 {
	var n atomic.Int64
	c.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		n.Add(1)
		return nil, nil, false
	})
	return &n
}

// newSeeded returns a producer (topic creation by outboxd, one-partition
// topics) on a one-broker kfake cluster whose topics a-events and b-events
// (three partitions each) exist already, and a context that ends the test
// after 30 s.
func newSeeded(t *testing.T) (*kfake.Cluster, func() *sink.Producer, context.Context) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "a-events", "b-events"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c, func() *sink.Producer {
		cfg := config.Default().Kafka
		cfg.Brokers = c.ListenAddrs()
		cfg.TopicPartitions, cfg.TopicReplicationFactor = 1, 1
		p, err := sink.New(cfg, sink.NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}, ctx
}

// produceOne produces one record to topic (partition -1: by key) and waits
// for its outcome.
func produceOne(ctx context.Context, p *sink.Producer, topic string, partition int32) error {
	acked := make(chan error, 1)
	rec := &router.Record{Topic: topic, Key: []byte("k"), Value: []byte("v"), EventID: "e", Partition: partition}
	if err := p.Produce(ctx, rec, func(err error) { acked <- err }); err != nil {
		return err
	}
	return <-acked
}

// TestWarmLoadsTheProducerID checks that Warm loads the idempotent
// producer's id, so that the first record does not wait for it, and that it
// is not loaded again for that record.
func TestWarmLoadsTheProducerID(t *testing.T) {
	c, newP, ctx := newSeeded(t)
	inits := counter(c, kmsg.InitProducerID)
	p := newP()
	if err := p.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if n := inits.Load(); n != 1 {
		t.Errorf("Warm sent %d InitProducerID requests, want 1", n)
	}
	if err := produceOne(ctx, p, "a-events", -1); err != nil {
		t.Fatal(err)
	}
	if n := inits.Load(); n != 1 {
		t.Errorf("%d InitProducerID requests after the first record, want only Warm's", n)
	}
}

// TestWarmReportsARefusedProducerID checks that a broker that refuses the
// producer id for good stops Warm with a line that says what to grant, and
// that a passing refusal does not.
func TestWarmReportsARefusedProducerID(t *testing.T) {
	tests := []struct {
		name string
		code int16
		want string // "" for no error
	}{
		{"not authorized", kerr.ClusterAuthorizationFailed.Code, "refused an idempotent producer id: CLUSTER_AUTHORIZATION_FAILED.*grant the principal Write on the topics"},
		{"other lasting refusal", kerr.InvalidRequest.Code, "refused an idempotent producer id: INVALID_REQUEST"},
		{"passing refusal", kerr.RequestTimedOut.Code, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, newP, ctx := newSeeded(t)
			c.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
				resp.ErrorCode = tt.code
				return resp, nil, true
			})
			err := newP().Warm(ctx)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Warm: %v, want nil (franz-go tries again on the first record)", err)
			case tt.want != "" && (err == nil || !regexp.MustCompile(tt.want).MatchString(err.Error())):
				t.Fatalf("Warm: %v, want an error matching %q", err, tt.want)
			}
		})
	}
}

// TestEnsureTopicLooksBeforeCreating checks that the first record to a topic
// that exists sends no CreateTopics (a request to the controller), also on
// a client that was never warmed (a pipeline after a restart), so that a
// principal without permission to create topics can use topics made for it;
// that the partition count of an existing topic is learned for records with
// an explicit partition; and that a missing topic is still created.
func TestEnsureTopicLooksBeforeCreating(t *testing.T) {
	c, newP, ctx := newSeeded(t)
	var creates atomic.Int64
	var deny atomic.Bool // answer CreateTopics with TOPIC_AUTHORIZATION_FAILED
	deny.Store(true)
	c.ControlKey(int16(kmsg.CreateTopics), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		creates.Add(1)
		if !deny.Load() {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
		for _, rt := range req.(*kmsg.CreateTopicsRequest).Topics {
			st := kmsg.NewCreateTopicsResponseTopic()
			st.Topic, st.ErrorCode = rt.Topic, kerr.TopicAuthorizationFailed.Code
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	p := newP()
	if err := produceOne(ctx, p, "a-events", -1); err != nil {
		t.Fatalf("producing to an existing topic without permission to create topics: %v", err)
	}
	if err := produceOne(ctx, p, "b-events", 2); err != nil {
		t.Fatalf("producing to partition 2 of an existing three-partition topic: %v", err)
	}
	if err := produceOne(ctx, p, "c-events", -1); err == nil || !strings.Contains(err.Error(), "creating topic \"c-events\"") {
		t.Fatalf("producing to a missing topic without permission to create it: %v, want the creation error", err)
	}
	if n := creates.Load(); n != 1 {
		t.Errorf("%d CreateTopics requests, want 1 (for the missing topic only)", n)
	}
	deny.Store(false)
	if err := produceOne(ctx, newP(), "c-events", -1); err != nil {
		t.Fatalf("producing to a missing topic: %v", err)
	}
	if n := creates.Load(); n != 2 {
		t.Errorf("%d CreateTopics requests, want 2: the missing topic is created", n)
	}
}

// TestWatchStartsItsClockWhenCalled checks that a producer made (and
// warmed) long before its pipeline starts is not reported as stalled as
// soon as its first records are in flight.
func TestWatchStartsItsClockWhenCalled(t *testing.T) {
	c := newCluster(t, 1)
	release := holdProduce(c)
	t.Cleanup(release)
	const timeout = 400 * time.Millisecond
	p, ctx := newProducer(t, c, func(cfg *config.Kafka) { cfg.DeliveryTimeout = timeout })
	time.Sleep(2 * timeout) // the producer waits, idle, longer than the timeout

	acked := make(chan error, 1)
	rec := &router.Record{Topic: topic, Key: []byte("k"), Value: []byte("v"), EventID: "e", Partition: -1}
	if err := p.Produce(ctx, rec, func(err error) { acked <- err }); err != nil {
		t.Fatal(err)
	}
	watch, stop := context.WithTimeout(ctx, timeout/2)
	defer stop()
	var stall *sink.StallError
	if err := p.Watch(watch, nil); errors.As(err, &stall) {
		t.Fatalf("Watch reported a stall %s after it started, with its record in flight for less than kafka.delivery_timeout (%s): %v",
			timeout/2, timeout, err)
	}
	release()
	if err := <-acked; err != nil {
		t.Fatal(err)
	}
}

// TestStallNamesMissingTopic checks that a record sent to a topic that does
// not exist (kafka.topic_creation: broker, auto-creation off) is never failed
// by franz-go (whose failure of a partition's records after repeated
// UNKNOWN_TOPIC_OR_PARTITION would bypass the fence), and that the watchdog's
// stall error names the topic.
func TestStallNamesMissingTopic(t *testing.T) {
	c := newCluster(t, 1)
	const timeout = 2 * time.Second
	p, ctx := newProducer(t, c, func(cfg *config.Kafka) { cfg.DeliveryTimeout = timeout; cfg.TopicCreation = config.TopicCreationBroker })
	acked := make(chan error, 1)
	rec := &router.Record{Topic: "nowhere-events", Key: []byte("k"), Value: []byte("v"), EventID: "e", Partition: -1}
	if err := p.Produce(ctx, rec, func(err error) { acked <- err }); err != nil {
		t.Fatal(err)
	}
	watch, stop := context.WithTimeout(ctx, 3*timeout)
	defer stop()
	err := p.Watch(watch, nil)
	select {
	case aerr := <-acked:
		t.Fatalf("the record to a missing topic was failed (%v): franz-go gave up on it", aerr)
	default:
	}
	var stall *sink.StallError
	if !errors.As(err, &stall) || !slices.Equal(stall.Missing, []string{"nowhere-events"}) ||
		!strings.Contains(err.Error(), "the topic does not exist: nowhere-events") {
		t.Fatalf("Watch returned %v, want a stall naming the missing topic nowhere-events", err)
	}
}

// TestWatchSeesAPartitionStoppedAlone checks that a record that waits while
// records of other topics keep being acknowledged ends the run after
// kafka.delivery_timeout: the oldest unconfirmed transaction (waiting) is
// what counts, not the last acknowledgement.
func TestWatchSeesAPartitionStoppedAlone(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	const timeout = time.Second
	p, ctx := newProducer(t, c, func(cfg *config.Kafka) { cfg.DeliveryTimeout = timeout; cfg.TopicCreation = config.TopicCreationBroker })
	var acked atomic.Bool
	handed := time.Now()
	stuck := &router.Record{Topic: "nowhere-events", Key: []byte("k"), Value: []byte("v"), EventID: "stuck", Partition: -1}
	if err := p.Produce(ctx, stuck, func(error) { acked.Store(true) }); err != nil {
		t.Fatal(err)
	}
	run, stop := context.WithTimeout(ctx, 5*timeout)
	defer stop()
	go func() { // later records of a topic that exists keep being acknowledged
		for i := 0; run.Err() == nil; i++ {
			rec := &router.Record{Topic: topic, Key: []byte("k"), Value: []byte("v"), EventID: fmt.Sprint(i), Partition: -1}
			if p.Produce(run, rec, func(error) {}) != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	waiting := func() time.Time {
		if acked.Load() {
			return time.Time{}
		}
		return handed
	}
	err = p.Watch(run, waiting)
	var stall *sink.StallError
	if !errors.As(err, &stall) || !stall.Partial || !strings.Contains(err.Error(), "the topic does not exist: nowhere-events") {
		t.Fatalf("Watch returned %v, want a stall of the record that waits alone, naming its missing topic", err)
	}
}
