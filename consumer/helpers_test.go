package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// env is one test's database, with the processed-events table, and a Kafka
// admin client.
type env struct {
	name    string
	pool    *pgxpool.Pool
	brokers []string
	kcl     *kgo.Client
	adm     *kadm.Client
}

func newEnv(t *testing.T, prefix string) *env {
	t.Helper()
	_, brokers := testenv.Services(t)
	ctx := context.Background()
	name, dsn := testenv.NewDatabase(t, prefix)
	e := &env{name: name, brokers: brokers}
	var err error
	if e.pool, err = pgxpool.New(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pool.Close)
	if err := CreateTable(ctx, e.pool, ""); err != nil {
		t.Fatal(err)
	}
	if e.kcl, err = kgo.NewClient(kgo.SeedBrokers(brokers...)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.kcl.Close)
	e.adm = kadm.NewClient(e.kcl)
	return e
}

// exec runs SQL on the test database.
func (e *env) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// topic creates a topic with a unique name; cleanup deletes it.
func (e *env) topic(t *testing.T, prefix string, partitions int32) string {
	t.Helper()
	name := prefix + "-" + testenv.RandomSuffix()
	resp, err := e.adm.CreateTopic(context.Background(), partitions, 1, nil, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("creating topic %s: %v", name, err)
	}
	t.Cleanup(func() { _, _ = e.adm.DeleteTopics(context.Background(), name) })
	return name
}

// produce writes records synchronously.
func (e *env) produce(t *testing.T, recs ...*kgo.Record) {
	t.Helper()
	if err := e.kcl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatalf("producing: %v", err)
	}
}

// running is a Consumer running in a goroutine.
type running struct {
	c    *Consumer
	stop context.CancelFunc
	done chan error
}

func start(c *Consumer) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	return r
}

// wait stops the consumer (if cancel), waits for Run and closes it.
func (r *running) wait(t *testing.T, cancel bool) error {
	t.Helper()
	if cancel {
		r.stop()
	}
	defer r.stop()
	select {
	case err := <-r.done:
		r.c.Close()
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("consumer did not stop within 30s")
		return nil
	}
}

// waitCommitted waits until group has committed every partition of topic
// to its end.
func (e *env) waitCommitted(t *testing.T, group, topic string, r *running) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("consumer stopped early: %v", err)
		default:
		}
		ends, err := e.adm.ListEndOffsets(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		committed, err := e.adm.FetchOffsets(ctx, group)
		if err == nil {
			all := true
			ends.Each(func(o kadm.ListedOffset) {
				c, ok := committed.Lookup(o.Topic, o.Partition)
				if !ok || c.At < o.Offset {
					all = false
				}
			})
			if all {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("group %s did not commit topic %s to its end within 30s", group, topic)
}
