package sink_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// produceAndWait hands rec over and waits for its outcome.
func produceAndWait(ctx context.Context, p *sink.Producer, rec *router.Record) error {
	done := make(chan error, 1)
	if err := p.Produce(ctx, rec, func(err error) { done <- err }); err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestPartitionColumnOnANewTopicWithBrokerCreation checks that a record
// whose partition a column chose, to a topic that does not exist yet, is
// delivered with kafka.topic_creation: broker and auto-creation on: the
// partition count is read with a lookup that lets the broker create the
// topic, as the producer's own lookups do (issue 32 item 11). It was read
// with one that did not, so the lookup waited 30 s for a topic nobody would
// create and the pipeline restarted, delivering nothing to any topic. With
// auto-creation off the wait ends at kafka.delivery_timeout with an error
// that says the topic does not exist and what to do.
func TestPartitionColumnOnANewTopicWithBrokerCreation(t *testing.T) {
	for _, auto := range []bool{true, false} {
		name := "auto-creation on"
		if !auto {
			name = "auto-creation off"
		}
		t.Run(name, func(t *testing.T) {
			opts := []kfake.Opt{kfake.NumBrokers(1), kfake.DefaultNumPartitions(3)}
			if auto {
				opts = append(opts, kfake.AllowAutoTopicCreation())
			}
			c, err := kfake.NewCluster(opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			const timeout = 3 * time.Second
			p, ctx := newProducer(t, c, func(cfg *config.Kafka) {
				cfg.TopicCreation, cfg.DeliveryTimeout = config.TopicCreationBroker, timeout
			})
			start := time.Now()
			err = produceAndWait(ctx, p, &router.Record{Topic: "tenants-events", Partition: 2, Key: []byte("k"), Value: []byte("{}"), EventID: "e1"})
			took := time.Since(start)
			if auto {
				if err != nil {
					t.Fatalf("a record placed on partition 2 of a topic the broker creates: %v (after %s)", err, took)
				}
				if took > time.Second {
					t.Errorf("the record took %s", took)
				}
				cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
					"tenants-events": {2: kgo.NewOffset().AtStart()}}))
				if err != nil {
					t.Fatal(err)
				}
				defer cl.Close()
				if fs := cl.PollRecords(ctx, 1); fs.NumRecords() != 1 || fs.Records()[0].Partition != 2 {
					t.Errorf("partition 2 holds %d records (%v)", fs.NumRecords(), fs.Errors())
				}
				return
			}
			if err == nil {
				t.Fatal("a record to a topic that does not exist, auto-creation off: no error")
			}
			if took > timeout+2*time.Second {
				t.Errorf("the lookup gave up after %s, want about kafka.delivery_timeout (%s)", took, timeout)
			}
			if msg := err.Error(); !strings.Contains(msg, `topic "tenants-events" does not exist and the brokers did not create it`) ||
				!strings.Contains(msg, "auto.create.topics.enable") {
				t.Errorf("the error does not say the topic is missing and what to do: %s", msg)
			}
			t.Logf("after %s: %v", took.Round(time.Millisecond), err)
		})
	}
}

// TestPartitionColumnOnARefusedTopic checks that a topic the brokers refuse
// for good (TOPIC_AUTHORIZATION_FAILED: no ACL to describe or create it),
// named by a record whose partition a column chose, stops outboxd at once
// with a permanent error that says what to grant, as the same refusal of a
// keyed record does, instead of restarting the pipeline every
// kafka.delivery_timeout and delivering nothing to any topic (review of
// issue 32 item 11).
func TestPartitionColumnOnARefusedTopic(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(int16(kmsg.Metadata), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.MetadataRequest)
		for _, rt := range r.Topics {
			if rt.Topic != nil && *rt.Topic == "secret" {
				resp := r.ResponseKind().(*kmsg.MetadataResponse)
				mt := kmsg.NewMetadataResponseTopic()
				mt.Topic = kmsg.StringPtr("secret")
				mt.ErrorCode = kerr.TopicAuthorizationFailed.Code
				resp.Topics = append(resp.Topics, mt)
				return resp, nil, true
			}
		}
		return nil, nil, false
	})
	p, ctx := newProducer(t, c, func(cfg *config.Kafka) {
		cfg.TopicCreation, cfg.DeliveryTimeout = config.TopicCreationBroker, 30*time.Second
	})
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second) // well under delivery_timeout
	defer cancel()
	err = produceAndWait(ctx, p, &router.Record{Topic: "secret", Partition: 0, Key: []byte("k"), Value: []byte("{}"), EventID: "e1"})
	var refused *sink.TopicRefusedError
	if !errors.As(err, &refused) || !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("got %v, want a TopicRefusedError for TOPIC_AUTHORIZATION_FAILED before delivery_timeout", err)
	}
	var perm interface{ Permanent() bool }
	if !errors.As(err, &perm) || !perm.Permanent() {
		t.Errorf("%v: not permanent, so the pipeline would restart for ever", err)
	}
	if !strings.Contains(refused.Hint(), "Describe") {
		t.Errorf("%v: its hint %q does not say what to grant", err, refused.Hint())
	}
}
