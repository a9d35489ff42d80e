package test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// keyFor returns a key that Java's murmur2 puts on partition p of n.
func keyFor(t *testing.T, p, n int) string {
	t.Helper()
	for i := range 1000 {
		k := fmt.Sprintf("key-%d", i)
		if int(javaPartition([]byte(k), n)) == p {
			return k
		}
	}
	t.Fatalf("no key for partition %d of %d", p, n)
	return ""
}

// A partition that does not move while the others acknowledge holds back the
// confirmation of every later transaction. Those transactions count toward
// kafka.max_buffered_records, so outboxd stops reading WAL at the cap instead
// of queueing them without bound; once the partition moves, everything is
// delivered. (Kafka here is franz-go's kfake, whose broker leading the stuck
// partition holds its produce requests.)
func TestStuckPartitionBoundsUnconfirmedTransactions(t *testing.T) {
	d := newDB(t)
	typ := d.name + "_stuck"
	topic := typ + "-events"
	c, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(2, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	stuckNode := c.LeaderFor(topic, 0)
	if c.LeaderFor(topic, 1) == stuckNode {
		if err := c.MoveTopicPartition(topic, 1, 1-stuckNode); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	var released bool
	t.Cleanup(func() {
		if !released {
			close(release)
		}
	})
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if c.CurrentNode() == stuckNode {
			c.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})

	const cap = 20
	env := replace(d.env(fmt.Sprintf("OUTBOXD_KAFKA_MAX_BUFFERED_RECORDS=%d", cap), "OUTBOXD_KAFKA_DELIVERY_TIMEOUT=5m",
		"OUTBOXD_KAFKA_TOPIC_CREATION=broker"), "OUTBOXD_KAFKA_BROKERS", strings.Join(c.ListenAddrs(), ","))
	p := start(t, env)
	p.waitStreaming()

	stuckKey, movingKey := keyFor(t, 0, 2), keyFor(t, 1, 2)
	first, _ := insertEvent(t, d, typ, stuckKey, `{}`)
	ids := []string{first}
	const behind = 10 * cap
	for range behind {
		id, _ := insertEvent(t, d, typ, movingKey, `{}`)
		ids = append(ids, id)
	}
	// Let outboxd read as far as it will.
	var read float64
	for deadline, last, since := time.Now().Add(30*time.Second), -1.0, time.Now(); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		read, _ = p.metric("outboxd_wal_transactions_total")
		if read != last {
			last, since = read, time.Now()
		} else if read > 0 && time.Since(since) > 3*time.Second {
			break
		}
	}
	confirmed, _ := p.metric("outboxd_checkpoint_transactions_confirmed_total")
	t.Logf("with partition 0 stuck: %g of %d transactions read, %g confirmed", read, behind+1, confirmed)
	if read > cap+1 {
		t.Errorf("outboxd read %g transactions behind a stuck one with kafka.max_buffered_records %d; want at most %d", read, cap, cap+1)
	}

	close(release)
	released = true
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for len(want) > 0 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { delete(want, header(r, "id")) })
	}
	if len(want) > 0 {
		t.Fatalf("%d of %d events never arrived after the partition moved again", len(want), len(ids))
	}
}
