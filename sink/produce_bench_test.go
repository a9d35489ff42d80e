package sink_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// BenchmarkProduce hands records of 250 B to an in-process kfake broker and
// waits for every acknowledgement: the sink's cost per record, franz-go and
// kfake included (allocs/op counts all three).
func BenchmarkProduce(b *testing.B) {
	c := newCluster(&testing.T{}, 1)
	defer c.Close()
	cfg := config.Default().Kafka
	cfg.Brokers = c.ListenAddrs()
	cfg.TopicPartitions = 6
	cfg.TopicReplicationFactor = 1
	p, err := sink.New(cfg, sink.NewMetrics(prometheus.NewRegistry()), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	recs := make([]*router.Record, 1000)
	for i := range recs {
		recs[i] = &router.Record{Topic: "bench-events", Key: []byte{'a', byte(i), byte(i >> 8)}, Value: make([]byte, 250), Partition: -1,
			Headers: []router.Header{{Key: "id", Value: []byte("0190b6a4-3f8e-7c3a-9d1e-5b2f8a7c6d4e")}, {Key: "eventType", Value: []byte("Created")}}}
	}
	var wg sync.WaitGroup
	done := func(err error) {
		if err != nil {
			panic(err)
		}
		wg.Done()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		wg.Add(1)
		if err := p.Produce(ctx, recs[i%len(recs)], done); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
}
