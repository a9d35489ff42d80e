package dlq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/kfaketest"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

func kgoHeaders(hs []router.Header) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, len(hs))
	for i, h := range hs {
		out[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return out
}

// bed is a kfake cluster with a dead-letter topic "dlq" (2 partitions),
// "orders-events" (3) and "small-events" (3, max.message.bytes 100), and
// the configuration of an outboxd on it.
type bed struct {
	c   *kfake.Cluster
	cfg config.Config
	cl  *kgo.Client
	adm *kadm.Client
	ctx context.Context
}

func newBed(t *testing.T, delivery config.Delivery) *bed {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg := config.Default()
	cfg.Kafka.Brokers = c.ListenAddrs()
	cfg.Kafka.TopicPartitions, cfg.Kafka.TopicReplicationFactor = 3, 1
	cfg.Kafka.DeliveryTimeout = 10 * time.Second
	cfg.Kafka.Delivery = delivery
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	b := &bed{c: c, cfg: cfg, cl: cl, adm: kadm.NewClient(cl), ctx: ctx}
	small := "100"
	for _, tc := range []struct {
		name    string
		n       int32
		configs map[string]*string
	}{{"dlq", 2, nil}, {"orders-events", 3, nil}, {"small-events", 3, map[string]*string{"max.message.bytes": &small}}} {
		if _, err := b.adm.CreateTopic(ctx, tc.n, 1, tc.configs, tc.name); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// seed writes dead letters as the relay does: one per id, to the
// partition of its key, with a payload of size bytes.
func (b *bed) seed(t *testing.T, topic string, size int, ids ...string) {
	t.Helper()
	for _, id := range ids {
		r := deadLetter(0, 0, id, topic)
		r.Topic, r.Partition, r.Offset, r.Timestamp = "dlq", 0, 0, time.Time{}
		r.Value = []byte(`{"id":"` + id + `","pad":"` + strings.Repeat("x", size) + `"}`)
		if err := b.cl.ProduceSync(b.ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

func (b *bed) redrive(t *testing.T, f Filter) *Result {
	t.Helper()
	res, err := Redrive(b.ctx, b.cfg, Options{Topic: "dlq", Filter: f, Batch: 3}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("redrive: %v", err)
	}
	return res
}

// read returns the records of topic, read_committed.
func (b *bed) read(t *testing.T, topic string) []*Letter {
	t.Helper()
	top, err := Read(b.ctx, b.cfg.Kafka, Only(defaults), topic)
	if err != nil {
		t.Fatal(err)
	}
	return top.Letters
}

func ids[T interface{ id() string }](ls []T) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.id())
	}
	slices.Sort(out)
	return out
}

func (l *Letter) id() string  { return l.EventID }
func (f *Failure) id() string { return f.EventID }

func pendingIDs(t *testing.T, b *bed) []string {
	t.Helper()
	top, err := Read(b.ctx, b.cfg.Kafka, Only(defaults), "dlq")
	if err != nil {
		t.Fatal(err)
	}
	return ids(top.Select(Filter{}))
}

var modes = []config.Delivery{config.AtLeastOnce, config.ExactlyOnce}

// list, redrive, still failing, twice: a dead letter goes back to its
// intended topic as it was, once; one that fails again stays with the new
// reason until its cause is fixed; a second run sends nothing again.
func TestRedrive(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			b := newBed(t, mode)
			b.seed(t, "orders-events", 10, "a", "b", "c", "d")
			b.seed(t, "small-events", 300, "big")
			b.seed(t, "", 10, "unrouted")

			res := b.redrive(t, Filter{})
			if got := ids(res.Redriven); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
				t.Errorf("redriven %v, want a b c d", got)
			}
			if got := ids(res.Failed); !slices.Equal(got, []string{"big"}) || !strings.Contains(res.Failed[0].Again, "MESSAGE_TOO_LARGE") {
				t.Errorf("failed again %v (%v), want big with MESSAGE_TOO_LARGE", got, res.Failed)
			}
			if got := ids(res.Skipped); !slices.Equal(got, []string{"unrouted"}) {
				t.Errorf("not redrivable %v, want unrouted", got)
			}
			orders := b.read(t, "orders-events")
			if got := ids(orders); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
				t.Fatalf("orders-events holds %v, want a b c d once each", got)
			}
			part := kgo.StickyKeyPartitioner(nil).ForTopic("orders-events")
			for _, l := range orders {
				var keys []string
				for _, h := range l.Headers {
					keys = append(keys, h.Key)
				}
				if strings.Join(keys, ",") != "id,eventType,tenantId" || string(l.Key) != "k-"+l.EventID ||
					!strings.HasPrefix(string(l.Value), `{"id":"`+l.EventID+`"`) {
					t.Errorf("redriven %s: key %q value %q headers %v; want the original's", l.EventID, l.Key, l.Value, keys)
				}
				if want := part.Partition(&kgo.Record{Key: l.Key}, 3); int32(want) != l.Partition {
					t.Errorf("redriven %s on partition %d, murmur2 of its key gives %d", l.EventID, l.Partition, want)
				}
			}
			top, err := Read(b.ctx, b.cfg.Kafka, Only(defaults), "dlq")
			if err != nil {
				t.Fatal(err)
			}
			pend := top.Select(Filter{})
			if got := ids(pend); !slices.Equal(got, []string{"big", "unrouted"}) {
				t.Fatalf("pending after the first run %v, want big unrouted", got)
			}
			for _, l := range pend {
				if l.EventID == "big" && (!strings.HasPrefix(l.Reason, "redrive: ") || !strings.Contains(l.Reason, "MESSAGE_TOO_LARGE") ||
					l.Topic != "small-events" || l.SourceLSN != "0/16B3748") {
					t.Errorf("big written again with reason %q, topic %q, lsn %q", l.Reason, l.Topic, l.SourceLSN)
				}
			}

			// Twice: nothing is sent again; big fails again.
			res = b.redrive(t, Filter{})
			if len(res.Redriven) != 0 || len(res.Failed) != 1 {
				t.Errorf("second run redrove %v and failed %v, want nothing and big", ids(res.Redriven), ids(res.Failed))
			}
			if got := ids(b.read(t, "orders-events")); len(got) != 4 {
				t.Errorf("after a second run orders-events holds %v, want a b c d once each", got)
			}

			// The cause fixed, big goes; a last run has nothing left.
			big := "1000000"
			if _, err := b.adm.AlterTopicConfigs(b.ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &big}}, "small-events"); err != nil {
				t.Fatal(err)
			}
			res = b.redrive(t, Filter{})
			if got := ids(res.Redriven); !slices.Equal(got, []string{"big"}) || len(res.Failed) != 0 {
				t.Errorf("after the fix redriven %v, failed %v; want big", got, ids(res.Failed))
			}
			if got := ids(b.read(t, "small-events")); !slices.Equal(got, []string{"big"}) {
				t.Errorf("small-events holds %v, want big", got)
			}
			if got := pendingIDs(t, b); !slices.Equal(got, []string{"unrouted"}) {
				t.Errorf("pending %v, want unrouted", got)
			}
			if res := b.redrive(t, Filter{}); len(res.Redriven)+len(res.Failed) != 0 {
				t.Errorf("a run with nothing pending redrove %v, failed %v", ids(res.Redriven), ids(res.Failed))
			}
		})
	}
}

// -id and -since select: the others stay pending.
func TestRedriveSelects(t *testing.T) {
	b := newBed(t, config.AtLeastOnce)
	b.seed(t, "orders-events", 10, "a", "b", "c")
	if res := b.redrive(t, Filter{IDs: []string{"b"}}); !slices.Equal(ids(res.Redriven), []string{"b"}) || len(res.NotPending) != 0 {
		t.Errorf("-id b redrove %v (not pending: %v)", ids(res.Redriven), res.NotPending)
	}
	if res := b.redrive(t, Filter{IDs: []string{"b", "x"}}); len(res.Redriven) != 0 || !slices.Equal(res.NotPending, []string{"b", "x"}) {
		t.Errorf("-id b,x after b was redriven: redrove %v, not pending %v; want nothing and b, x", ids(res.Redriven), res.NotPending)
	}
	if res := b.redrive(t, Filter{Since: time.Now().Add(time.Hour)}); len(res.Redriven) != 0 {
		t.Errorf("-since in the future redrove %v", ids(res.Redriven))
	}
	if got := pendingIDs(t, b); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("pending %v, want a c", got)
	}
}

// A run that ends after its records reached the intended topic and before
// they were marked (its markers refused, as a run killed there) leaves them
// pending; the next run sends them again. A consumer that deduplicates on
// the id sees each once; in exactly_once the first run's records were
// aborted, and a read_committed consumer sees each once without
// deduplicating.
func TestRedriveResumes(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			b := newBed(t, mode)
			b.seed(t, "orders-events", 10, "a", "b", "c", "d", "e")
			td, err := b.adm.ListTopics(b.ctx, "dlq")
			if err != nil {
				t.Fatal(err)
			}
			dlqID := td["dlq"].ID
			var refuse, refused atomic.Bool
			refuse.Store(true)
			b.c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				b.c.KeepControl()
				r := req.(*kmsg.ProduceRequest)
				for _, rt := range r.Topics {
					if (rt.Topic == "dlq" || rt.TopicID == dlqID) && refuse.Load() {
						refused.Store(true)
						return kfaketest.ProduceResponse(r, kerr.ClusterAuthorizationFailed.Code), nil, true
					}
				}
				return nil, nil, false
			})
			_, err = Redrive(b.ctx, b.cfg, Options{Topic: "dlq", Batch: 2}, slog.New(slog.DiscardHandler))
			if err == nil || !refused.Load() {
				t.Fatalf("the run whose markers were refused ended with %v", err)
			}
			t.Logf("first run: %v", err)
			if got := pendingIDs(t, b); len(got) != 5 {
				t.Fatalf("pending after the failed run %v, want all 5", got)
			}
			sent := len(b.read(t, "orders-events"))
			if mode == config.ExactlyOnce && sent != 0 {
				t.Errorf("a read_committed consumer sees %d records of the aborted run", sent)
			}
			refuse.Store(false)
			res := b.redrive(t, Filter{})
			if len(res.Redriven) != 5 {
				t.Fatalf("resumed run redrove %v", ids(res.Redriven))
			}
			recs := b.read(t, "orders-events")
			got := ids(recs)
			got = slices.Compact(got)
			if !slices.Equal(got, []string{"a", "b", "c", "d", "e"}) {
				t.Errorf("deduplicated by id, orders-events holds %v, want a to e", got)
			}
			if mode == config.ExactlyOnce && len(recs) != 5 {
				t.Errorf("read_committed, orders-events holds %d records, want 5", len(recs))
			}
			t.Logf("%s: %d records for 5 events", mode, len(recs))
		})
	}
}

// exactly_once, two redrives at once: B starts (its Init fences A) and
// finishes between A's batches. A's next batch is refused as fenced: A ends
// with the fencing error, and does not open a new producer (which would
// fence B back) to send its stale letters again. A read_committed consumer
// sees each event once.
func TestRedriveFencedRunEnds(t *testing.T) {
	b, all := newBed(t, config.ExactlyOnce), letters(12)
	b.seed(t, "orders-events", 10, all...)
	res, err := fencedMidway(t, b, func(*kmsg.ProduceRequest) bool { return true })
	var fenced *sink.FencedError
	if !errors.As(err, &fenced) {
		t.Errorf("run A, fenced by B, ended with %v; want a *sink.FencedError", err)
	}
	t.Logf("run A redrove %v, ended with %v", ids(res.Redriven), err)
	if got := ids(b.read(t, "orders-events")); !slices.Equal(got, all) {
		t.Errorf("read_committed, orders-events holds %d records %v; want e00 to e11 once each", len(got), got)
	}
	if got := pendingIDs(t, b); len(got) != 0 {
		t.Errorf("pending after both runs: %v", got)
	}
}

// letters are the event ids e00, e01, … of n dead letters.
func letters(n int) []string {
	var all []string
	for i := range n {
		all = append(all, fmt.Sprintf("e%02d", i))
	}
	return all
}

// fencedMidway runs redrive A in batches of 4. When A, after its first
// commit, sends a produce request that hold accepts, redrive B runs to its
// end (fencing A) before the request goes on. It returns A's result and
// error; B must have run and succeeded.
func fencedMidway(t *testing.T, b *bed, hold func(*kmsg.ProduceRequest) bool) (*Result, error) {
	t.Helper()
	var commits atomic.Int32
	b.c.ControlKey(int16(kmsg.EndTxn), func(kmsg.Request) (kmsg.Response, error, bool) {
		b.c.KeepControl()
		commits.Add(1)
		return nil, nil, false
	})
	var started atomic.Bool
	var bErr error
	b.c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.c.KeepControl()
		if commits.Load() != 1 || !hold(req.(*kmsg.ProduceRequest)) || started.Swap(true) {
			return nil, nil, false
		}
		b.c.SleepControl(func() {
			done := make(chan struct{})
			go func() {
				defer close(done)
				res, err := Redrive(b.ctx, b.cfg, Options{Topic: "dlq", Batch: 100}, slog.New(slog.DiscardHandler))
				bErr = err
				if res != nil {
					t.Logf("run B redrove %v", ids(res.Redriven))
				}
			}()
			<-done
		})
		return nil, nil, false
	})
	res, err := Redrive(b.ctx, b.cfg, Options{Topic: "dlq", Batch: 4}, slog.New(slog.DiscardHandler))
	if !started.Load() || bErr != nil {
		t.Fatalf("run B started %v, ended with %v", started.Load(), bErr)
	}
	return res, err
}

// exactly_once, the daemon opens a transaction in the dead-letter topic
// while a redrive runs (a dead letter of a Postgres transaction being
// streamed): the redrive's markers are committed after it. A second run,
// started while the daemon's transaction is still open, waits for it rather
// than read to the last stable offset, which would miss the markers and
// send every letter again.
func TestRedriveSeesMarkersBehindOpenTransaction(t *testing.T) {
	b := newBed(t, config.ExactlyOnce)
	b.seed(t, "orders-events", 10, "a", "b", "c", "d")
	td, err := b.adm.ListTopics(b.ctx, "orders-events")
	if err != nil {
		t.Fatal(err)
	}
	ordersID := td["orders-events"].ID
	daemon := b.txnClient(t, "outboxd-7000-outboxd")
	var opened, second atomic.Bool
	b.c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.c.KeepControl()
		r := req.(*kmsg.ProduceRequest)
		if len(r.Topics) == 0 || (r.Topics[0].Topic != "orders-events" && r.Topics[0].TopicID != ordersID) || opened.Swap(true) {
			return nil, nil, false
		}
		// The first run has read the topic: the daemon opens its
		// transaction in it before the run's markers.
		b.c.SleepControl(func() { b.putLetters(t, daemon, "open") })
		return nil, nil, false
	})
	committed := make(chan error, 1)
	b.c.ControlKey(int16(kmsg.ListOffsets), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.c.KeepControl()
		r := req.(*kmsg.ListOffsetsRequest)
		if !second.Load() || len(r.Topics) == 0 || len(r.Topics[0].Partitions) == 0 || r.Topics[0].Partitions[0].Timestamp != -1 {
			return nil, nil, false
		}
		// The second run asks where the topic ends: the daemon commits
		// after the answer.
		second.Store(false)
		go func() { committed <- daemon.EndTransaction(b.ctx, kgo.TryCommit) }()
		return nil, nil, false
	})
	if res := b.redrive(t, Filter{}); !slices.Equal(ids(res.Redriven), []string{"a", "b", "c", "d"}) || !opened.Load() {
		t.Fatalf("first run redrove %v (daemon's transaction opened: %v)", ids(res.Redriven), opened.Load())
	}
	second.Store(true)
	res := b.redrive(t, Filter{})
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	if got := ids(res.Redriven); !slices.Equal(got, []string{"open", "open"}) {
		t.Errorf("second run redrove %v, want the daemon's two letters", got)
	}
	if got := ids(b.read(t, "orders-events")); !slices.Equal(got, []string{"a", "b", "c", "d", "open", "open"}) {
		t.Errorf("read_committed, orders-events holds %v; want a b c d and the daemon's letters once each", got)
	}
}

// seedGood seeds n dead letters g0000... for orders-events and returns
// their ids.
func (b *bed) seedGood(t *testing.T, n int) []string {
	t.Helper()
	var good []string
	for i := 0; i < n; i++ {
		good = append(good, fmt.Sprintf("g%04d", i))
	}
	b.seed(t, "orders-events", 10, good...)
	return good
}

// A letter Kafka rejects (MESSAGE_TOO_LARGE) at the head of a batch breaks
// the producer while the rest of the batch is being handed over: those are
// not handed over, or fail unwritten, through no fault of their own. They
// are sent again alone and redriven; only the rejected one fails again, with
// its own reason, and a second run has only it to try.
func TestRedriveRejectedHeadOfBatch(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			b := newBed(t, mode)
			b.seed(t, "small-events", 300, "big")
			good := b.seedGood(t, 200)
			b.cfg.Kafka.MaxBufferedBytes = 4096 // Produce waits for acks, as with a large batch of large letters
			for run := 1; run <= 2; run++ {
				res, err := Redrive(b.ctx, b.cfg, Options{Topic: "dlq", Batch: 201}, slog.New(slog.DiscardHandler))
				if err != nil {
					t.Fatalf("run %d ended with %v; want big failed again and the rest redriven", run, err)
				}
				if got := ids(res.Failed); !slices.Equal(got, []string{"big"}) || !strings.Contains(res.Failed[0].Again, "MESSAGE_TOO_LARGE") {
					t.Errorf("run %d failed again %d letters (%v); want big with MESSAGE_TOO_LARGE", run, len(got), reasons(res.Failed))
				}
				if want := map[int]int{1: 200, 2: 0}[run]; len(res.Redriven) != want {
					t.Errorf("run %d redrove %d letters, want %d", run, len(res.Redriven), want)
				}
			}
			if got := ids(b.read(t, "orders-events")); !slices.Equal(got, good) {
				t.Errorf("orders-events holds %d records, want g0000 to g0199 once each", len(got))
			}
			if got := pendingIDs(t, b); !slices.Equal(got, []string{"big"}) {
				t.Errorf("pending %d letters, want big", len(got))
			}
		})
	}
}

// A topic refused at the head of a batch (TOPIC_AUTHORIZATION_FAILED on
// produce): the letters of other topics handed over after the refusal
// broke the producer are redriven, not written back under that topic's
// error.
func TestRedriveRefusedTopicSparesOthers(t *testing.T) {
	b := newBed(t, config.AtLeastOnce)
	b.seed(t, "small-events", 10, "denied")
	b.seedGood(t, 200)
	b.cfg.Kafka.MaxBufferedBytes = 4096
	td, err := b.adm.ListTopics(b.ctx, "small-events")
	if err != nil {
		t.Fatal(err)
	}
	id := td["small-events"].ID
	b.c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.c.KeepControl()
		r := req.(*kmsg.ProduceRequest)
		for _, rt := range r.Topics {
			if rt.Topic == "small-events" || rt.TopicID == id {
				return kfaketest.ProduceResponse(r, kerr.TopicAuthorizationFailed.Code), nil, true
			}
		}
		return nil, nil, false
	})
	res, err := Redrive(b.ctx, b.cfg, Options{Topic: "dlq", Batch: 201}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(res.Failed); !slices.Equal(got, []string{"denied"}) || !strings.Contains(res.Failed[0].Again, "TOPIC_AUTHORIZATION_FAILED") {
		t.Errorf("failed again %d letters (%v); want denied with TOPIC_AUTHORIZATION_FAILED", len(got), reasons(res.Failed))
	}
	if len(res.Redriven) != 200 {
		t.Errorf("redriven %d letters, want 200", len(res.Redriven))
	}
}

// reasons returns the first two failures as "id: new reason".
func reasons(fs []*Failure) []string {
	var out []string
	for _, f := range fs[:min(2, len(fs))] {
		out = append(out, f.EventID+": "+f.Again)
	}
	return out
}

// A key's dead letters go back in the order of their rows' commits (source
// LSN), wherever they are in the dead-letter topic: in two partitions
// (written before and after it got more), or a rewritten older one after a
// newer one in its partition.
func TestRedriveInSourceOrder(t *testing.T) {
	b := newBed(t, config.AtLeastOnce)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, w := range []struct {
		id, lsn string
		p       int32
		extra   []string
	}{
		{"third", "0/300", 0, nil},
		{"second", "0/200", 0, []string{HeaderSupersedes, "1/99"}}, // written again after third
		{"first", "0/100", 1, nil},
	} {
		r := deadLetter(0, 0, w.id, "orders-events", w.extra...)
		r.Topic, r.Partition, r.Offset, r.Timestamp, r.Key = "dlq", w.p, 0, time.Time{}, []byte("k")
		for i := range r.Headers {
			if r.Headers[i].Key == HeaderSourceLSN {
				r.Headers[i].Value = []byte(w.lsn)
			}
		}
		if err := cl.ProduceSync(b.ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	b.redrive(t, Filter{})
	var got []string
	for _, l := range b.read(t, "orders-events") { // one key: one partition, in offset order
		got = append(got, l.EventID)
	}
	if want := []string{"first", "second", "third"}; !slices.Equal(got, want) {
		t.Errorf("orders-events holds %v, want %v", got, want)
	}
}

// TestRedriveFencedDuringMarkersEnds: TestRedriveFencedRunEnds with run B
// running while A's markers (settle) are held, not its records: A still ends
// with a *sink.FencedError (kfake: B's Init does not abort A's open
// transaction as Kafka does, so read_committed is not checked here; the
// real-broker test is test/dlq_test.go).
func TestRedriveFencedDuringMarkersEnds(t *testing.T) {
	b := newBed(t, config.ExactlyOnce)
	b.seed(t, "orders-events", 10, letters(12)...)
	td, err := b.adm.ListTopics(b.ctx, "dlq")
	if err != nil {
		t.Fatal(err)
	}
	dlqID := td["dlq"].ID
	res, err := fencedMidway(t, b, func(r *kmsg.ProduceRequest) bool {
		return len(r.Topics) > 0 && (r.Topics[0].Topic == "dlq" || r.Topics[0].TopicID == dlqID)
	})
	var fenced *sink.FencedError
	if !errors.As(err, &fenced) {
		t.Errorf("run A, fenced by B during its markers, ended with %v; want a *sink.FencedError", err)
	}
	t.Logf("run A redrove %v, ended with %v", ids(res.Redriven), err)
	if got := pendingIDs(t, b); len(got) != 0 {
		t.Errorf("pending after both runs: %v", got)
	}
}
