package sink_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// The relay routes every insert into one router.Record and reuses it as
// soon as Produce returns. Each record must still arrive as it was, with
// its own headers, and a failure must name its own event, not the one the
// record holds by the time Kafka answers. (Run with -race, a producer that
// still read the record would also be a data race.)
func TestProduceKeepsNoReferenceToRecord(t *testing.T) {
	const n = 50
	c := newCluster(t, 1)
	p, ctx := newProducer(t, c, nil)
	var rec router.Record
	var hdrs [1]router.Header // reused like the router's backing array
	acked := make(chan error, n)
	for i := range n {
		id := fmt.Sprint(i)
		hdrs[0] = router.Header{Key: "id", Value: []byte(id)}
		rec = router.Record{Topic: topic, Key: []byte("k" + id), Value: []byte("v" + id), Headers: hdrs[:1],
			EventID: id, Partition: -1, CommitTime: time.Now()}
		if err := p.Produce(ctx, &rec, func(err error) { acked <- err }); err != nil {
			t.Fatal(err)
		}
		rec = router.Record{Topic: "scribbled", EventID: "scribbled"}
		hdrs[0] = router.Header{Key: "scribbled", Value: []byte("scribbled")}
	}
	for range n {
		if err := <-acked; err != nil {
			t.Fatal(err)
		}
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := 0
	for got < n && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			id := fmt.Sprint(got)
			if string(r.Key) != "k"+id || string(r.Value) != "v"+id || len(r.Headers) != 1 ||
				r.Headers[0].Key != "id" || string(r.Headers[0].Value) != id {
				t.Errorf("record %d arrived as key %q, value %q, headers %v", got, r.Key, r.Value, r.Headers)
			}
			got++
		})
	}
	if got != n {
		t.Fatalf("read %d records back, want %d", got, n)
	}
}

func TestDeliveryErrorNamesItsOwnEvent(t *testing.T) {
	p, ctx := rejectingProducer(t)
	rec := router.Record{Topic: topic, Key: []byte("k"), Value: []byte("v"), EventID: "the-rejected-one", Partition: -1}
	failed := make(chan error, 1)
	if err := p.Produce(ctx, &rec, func(err error) { failed <- err }); err != nil {
		t.Fatal(err)
	}
	rec.EventID = "the-next-one"
	var de *sink.DeliveryError
	select {
	case err := <-failed:
		if !errors.As(err, &de) || de.EventID != "the-rejected-one" {
			t.Fatalf("got %v, want a DeliveryError for event the-rejected-one", err)
		}
	case <-ctx.Done():
		t.Fatal(context.Cause(ctx))
	}
}
