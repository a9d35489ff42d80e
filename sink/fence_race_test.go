package sink_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/kfaketest"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// A record that passed Produce's fence check just before Kafka rejected an
// earlier batch of its partition reaches franz-go's buffer only after
// franz-go has failed that partition's buffered records and bumped its
// producer epoch. franz-go would then write it at once, ahead of the
// rejected record that the next run sends again. Only the record's
// context, the fence, stops it. The test holds the record inside franz-go's
// Produce (its buffered hook runs before the record joins a batch) until
// the rejection has been handled, so it reaches that moment every time.
func TestRecordInFlightAtRejectionCarriesTheFence(t *testing.T) {
	c := newCluster(t, 1)

	// The first produce request (record a1) waits for reject, then is
	// rejected with INVALID_RECORD. Later requests are served.
	var requests atomic.Int64
	held, reject := make(chan struct{}), make(chan struct{})
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if requests.Add(1) > 1 {
			return nil, nil, false
		}
		close(held)
		c.SleepControl(func() { <-reject })
		return kfaketest.ProduceResponse(req, kerr.InvalidRecord.Code), nil, true
	})
	hook := &holdBuffering{value: "b", entered: make(chan struct{}), proceed: make(chan struct{})}
	rejectA1 := sync.OnceFunc(func() { close(reject) })
	releaseB := sync.OnceFunc(func() { close(hook.proceed) })

	cfg := config.Default().Kafka
	cfg.Brokers = c.ListenAddrs()
	cfg.TopicPartitions = 1
	cfg.TopicReplicationFactor = 1
	p, err := sink.New(cfg, sink.NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler), kgo.WithHooks(hook))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	// Should the test end early, unblock both before the producer and
	// the cluster close (cleanups run last first).
	t.Cleanup(func() { rejectA1(); releaseB() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if err := p.EnsureTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}

	rec := func(id string) *router.Record {
		return &router.Record{Topic: topic, Key: []byte("k"), Value: []byte(id), EventID: id, Partition: -1}
	}
	wait := func(what string, ch <-chan error) error {
		t.Helper()
		select {
		case err := <-ch:
			return err
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
			return nil
		}
	}
	outcome := map[string]chan error{"a1": make(chan error, 1), "a2": make(chan error, 1), "b": make(chan error, 1)}
	produce := func(id string) error {
		ch := outcome[id]
		return p.Produce(ctx, rec(id), func(err error) { ch <- err })
	}

	// a1 is written and held by the broker; a2 waits in franz-go's buffer
	// behind it (franz-go sends nothing more before a1's answer).
	if err := produce("a1"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("a1's produce request never reached the broker")
	}
	if err := produce("a2"); err != nil {
		t.Fatal(err)
	}
	// b passes the fence check (nothing has failed yet) and stops inside
	// franz-go's Produce.
	handedOver := make(chan error, 1)
	go func() { handedOver <- produce("b") }()
	select {
	case <-hook.entered:
	case <-ctx.Done():
		t.Fatal("b never reached franz-go")
	}

	// The broker rejects a1; franz-go fails a1 and a2.
	rejectA1()
	for _, id := range []string{"a1", "a2"} {
		if err := wait(id+"'s outcome", outcome[id]); !errors.Is(err, kerr.InvalidRecord) {
			t.Errorf("%s: got %v, want INVALID_RECORD", id, err)
		}
	}

	// Now b joins franz-go's buffer, behind a failure it was handed over
	// after: it must fail, never be written.
	releaseB()
	if err := wait("b's Produce", handedOver); err != nil {
		t.Fatalf("b was not handed over (%v): the test did not reach the race", err)
	}
	var de *sink.DeliveryError
	switch err := wait("b's outcome", outcome["b"]); {
	case err == nil:
		t.Error("b, handed over before a1's rejection was known, was written after it")
	case !errors.As(err, &de) || de.EventID != "b" || !errors.Is(err, context.Canceled):
		t.Errorf("b: got %v, want a *sink.DeliveryError naming b, failed by its cancelled context (the fence)", err)
	}

	// Read the partition up to a sentinel written now: nothing of this
	// run may be before it.
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("sentinel")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for sentinel := false; !sentinel; {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("the sentinel never came back")
		}
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Value) == "sentinel" {
				sentinel = true
			} else if !sentinel {
				t.Errorf("record %q is in the topic (offset %d), written after the rejection of a1", r.Value, r.Offset)
			}
		})
	}
}

// holdBuffering holds the record whose value is value inside franz-go's
// Produce, before it joins a batch, until proceed is closed.
type holdBuffering struct {
	value   string
	entered chan struct{}
	proceed chan struct{}
}

func (h *holdBuffering) OnProduceRecordBuffered(r *kgo.Record) {
	if string(r.Value) == h.value {
		close(h.entered)
		<-h.proceed
	}
}
