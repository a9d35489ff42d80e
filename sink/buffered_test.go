package sink_test

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
)

// TestProduceBlocksAtMaxBufferedBytes holds every produce response and checks
// that Produce hands over records only while their bytes fit in
// kafka.max_buffered_bytes, that the buffer fill reports it, that a record
// larger than the cap still goes (alone), and that acknowledgements unblock
// the rest.
func TestProduceBlocksAtMaxBufferedBytes(t *testing.T) {
	c := newCluster(t, 1)
	release := holdProduce(c)

	p, ctx := newProducer(t, c, func(cfg *config.Kafka) {
		cfg.MaxBufferedRecords = 100
		cfg.MaxBufferedBytes = 2500
	})

	rec := func(i, size int) *router.Record { // size bytes of key and value
		key := fmt.Sprintf("k%03d", i)
		return &router.Record{Topic: topic, Key: []byte(key), Value: bytes.Repeat([]byte("x"), size-len(key)),
			EventID: fmt.Sprint(i), Partition: -1}
	}
	var acked atomic.Int32
	done := func(err error) {
		if err != nil {
			t.Errorf("delivery failed: %v", err)
		}
		acked.Add(1)
	}
	// Two records of 1,000 bytes fit in 2,500; the third must wait.
	for i := range 2 {
		if err := p.Produce(ctx, rec(i, 1000), done); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.Fill(); got != 0.8 {
		t.Errorf("Fill() = %v with 2,000 of 2,500 bytes in flight, want 0.8", got)
	}
	third := make(chan error, 1)
	go func() { third <- p.Produce(ctx, rec(2, 1000), done) }()
	select {
	case err := <-third:
		t.Fatalf("a third 1,000-byte record was handed over with a 2,500-byte cap and nothing acknowledged (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}

	release()
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	// A record over the cap goes alone, once everything before it is acked.
	if err := p.Produce(ctx, rec(3, 4000), done); err != nil {
		t.Fatalf("a record over max_buffered_bytes was not handed over: %v", err)
	}
	for acked.Load() < 4 {
		if ctx.Err() != nil {
			t.Fatalf("%d of 4 records acknowledged", acked.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := p.Fill(); got != 0 {
		t.Errorf("Fill() = %v with nothing in flight, want 0", got)
	}
}

// At max_buffered_records unacknowledged records, Produce waits until one
// is acknowledged: the record cap, like the byte cap, is what stops WAL
// reading instead of growing memory.
func TestProduceBlocksAtMaxBufferedRecords(t *testing.T) {
	c := newCluster(t, 1)
	release := holdProduce(c)
	p, ctx := newProducer(t, c, func(cfg *config.Kafka) {
		cfg.MaxBufferedRecords = 3
		cfg.MaxBufferedBytes = 1 << 20
	})
	var acked atomic.Int32
	done := func(err error) {
		if err != nil {
			t.Errorf("delivery failed: %v", err)
		}
		acked.Add(1)
	}
	rec := func(i int) *router.Record {
		return &router.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v"), EventID: fmt.Sprint(i), Partition: -1}
	}
	for i := range 3 {
		if err := p.Produce(ctx, rec(i), done); err != nil {
			t.Fatal(err)
		}
	}
	fourth := make(chan error, 1)
	go func() { fourth <- p.Produce(ctx, rec(3), done) }()
	select {
	case err := <-fourth:
		t.Fatalf("a fourth record was handed over with max_buffered_records 3 and nothing acknowledged (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	if err := <-fourth; err != nil {
		t.Fatal(err)
	}
	for acked.Load() < 4 {
		if ctx.Err() != nil {
			t.Fatalf("%d of 4 records acknowledged", acked.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
