package dlq

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/config"
)

// txnClient is a transactional producer (as a daemon in exactly_once, or a
// killed redrive) with a transaction open.
func (b *bed) txnClient(t *testing.T, id string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.c.ListenAddrs()...), kgo.TransactionalID(id),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.TransactionTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	return cl
}

// putLetters writes a dead letter of event id for orders-events to each
// partition of the dead-letter topic, in cl's open transaction.
func (b *bed) putLetters(t *testing.T, cl *kgo.Client, id string) {
	t.Helper()
	for p := int32(0); p < 2; p++ {
		r := deadLetter(p, 0, id, "orders-events")
		r.Topic, r.Partition, r.Offset, r.Timestamp = "dlq", p, 0, time.Time{}
		if err := cl.ProduceSync(b.ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// A read goes to the high watermark: a Kafka transaction open in the topic
// is waited for, and a read it holds up for kafka.delivery_timeout says so.
// The last offset below the last stable offset may be an aborted
// transaction's record whose abort marker lies above it (a killed redrive's
// transaction, aborted after the daemon opened its own): that ends no read.
func TestReadWaitsForOpenTransaction(t *testing.T) {
	b := newBed(t, config.ExactlyOnce)
	b.cfg.Kafka.DeliveryTimeout = 2 * time.Second
	b.seed(t, "orders-events", 10, "a")
	killed := b.txnClient(t, "outboxd-dlq-redrive-other")
	b.putLetters(t, killed, "x")
	daemon := b.txnClient(t, "outboxd-7000-outboxd")
	b.putLetters(t, daemon, "open")
	if err := killed.EndTransaction(b.ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	_, err := Read(b.ctx, b.cfg.Kafka, Only(defaults), "dlq")
	if err == nil || !strings.Contains(err.Error(), "hold a Kafka transaction still open") {
		t.Fatalf("a read held up by an open transaction ended with %v; want it to say so", err)
	}
	t.Log(err)
	if err := daemon.EndTransaction(b.ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	top, err := Read(b.ctx, b.cfg.Kafka, Only(defaults), "dlq")
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(top.Letters); !slices.Equal(got, []string{"a", "open", "open"}) {
		t.Errorf("letters %v, want a and the committed open (x was aborted)", got)
	}
}

// A compacted dead-letter topic is refused: compaction would remove a
// pending dead letter when a later record of its key arrives.
func TestReadRefusesCompactedTopic(t *testing.T) {
	b := newBed(t, config.AtLeastOnce)
	compact := "compact,delete"
	if _, err := b.adm.CreateTopic(b.ctx, 1, 1, map[string]*string{"cleanup.policy": &compact}, "dlq-compacted"); err != nil {
		t.Fatal(err)
	}
	_, err := Read(b.ctx, b.cfg.Kafka, Only(defaults), "dlq-compacted")
	if err == nil || !strings.Contains(err.Error(), "cleanup.policy=compact,delete") || !strings.Contains(err.Error(), "set cleanup.policy=delete") {
		t.Errorf("reading a compacted dead-letter topic: %v; want it refused, saying what to set", err)
	}
	if _, err := Redrive(b.ctx, b.cfg, Options{Topic: "dlq-compacted"}, slog.New(slog.DiscardHandler)); err == nil {
		t.Errorf("redrive of a compacted dead-letter topic was not refused")
	}
	if _, err := Read(b.ctx, b.cfg.Kafka, Only(defaults), "dlq"); err != nil {
		t.Errorf("reading a topic with cleanup.policy=delete: %v", err)
	}
}
