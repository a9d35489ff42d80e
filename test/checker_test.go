package test

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// report is what the checker found in Kafka against a ledger.
type report struct {
	Delivered       int      // records read
	Lost            []string // committed, never delivered
	Phantom         []string // delivered, never committed (rolled back or unknown)
	Duplicates      int      // deliveries beyond the first
	OrderViolations []string // first deliveries of a key out of commit order
	Misrouted       []string // wrong topic, key, partition, value or headers
}

func (r report) String() string {
	return fmt.Sprintf("delivered=%d lost=%d phantom=%d duplicates=%d order_violations=%d misrouted=%d",
		r.Delivered, len(r.Lost), len(r.Phantom), r.Duplicates, len(r.OrderViolations), len(r.Misrouted))
}

// failOnLoss fails t for any lost, phantom, out-of-order or misrouted event.
func (r report) failOnLoss(t *testing.T) {
	t.Helper()
	first := func(s []string) string {
		if len(s) > 10 {
			s = s[:10]
		}
		return strings.Join(s, "\n  ")
	}
	if len(r.Lost) > 0 {
		t.Errorf("%d lost events, e.g.:\n  %s", len(r.Lost), first(r.Lost))
	}
	if len(r.Phantom) > 0 {
		t.Errorf("%d phantom events, e.g.:\n  %s", len(r.Phantom), first(r.Phantom))
	}
	if len(r.OrderViolations) > 0 {
		t.Errorf("%d per-key order violations, e.g.:\n  %s", len(r.OrderViolations), first(r.OrderViolations))
	}
	if len(r.Misrouted) > 0 {
		t.Errorf("%d misrouted records, e.g.:\n  %s", len(r.Misrouted), first(r.Misrouted))
	}
}

// check compares records read from Kafka with the ledger. partitions gives
// each topic's partition count.
func check(l *ledger, recs []*kgo.Record, partitions map[string]int) report {
	l.mu.Lock()
	defer l.mu.Unlock()
	var r report
	r.Delivered = len(recs)
	sorted := inLogOrder(recs)
	seen := map[string]int{}
	lastSeq := map[string]int{} // topic/key -> seq of the last first delivery
	for _, rec := range sorted {
		id := header(rec, "id")
		seen[id]++
		if seen[id] > 1 {
			r.Duplicates++
			continue
		}
		e, ok := l.committed[id]
		if !ok {
			_, rolled := l.rolledBack[id]
			r.Phantom = append(r.Phantom, fmt.Sprintf("id=%s rolled_back=%v topic=%s offset=%d", id, rolled, rec.Topic, rec.Offset))
			continue
		}
		if why := misrouted(e, rec, partitions); why != "" {
			r.Misrouted = append(r.Misrouted, fmt.Sprintf("id=%s: %s", id, why))
		}
		k := rec.Topic + "/" + string(rec.Key)
		if prev, ok := lastSeq[k]; ok && e.Seq <= prev {
			r.OrderViolations = append(r.OrderViolations, fmt.Sprintf("key %s: seq %d delivered after seq %d (offset %d)", k, e.Seq, prev, rec.Offset))
		}
		lastSeq[k] = e.Seq
	}
	for id, e := range l.committed {
		if seen[id] == 0 {
			r.Lost = append(r.Lost, fmt.Sprintf("id=%s topic=%s key=%s seq=%d", id, e.topic(), e.Key, e.Seq))
		}
	}
	sort.Strings(r.Lost)
	return r
}

// inLogOrder returns recs sorted by topic, partition and offset: each
// partition's records in the order a consumer reads them.
func inLogOrder(recs []*kgo.Record) []*kgo.Record {
	sorted := append([]*kgo.Record(nil), recs...)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		if a.Partition != b.Partition {
			return a.Partition < b.Partition
		}
		return a.Offset < b.Offset
	})
	return sorted
}

func misrouted(e event, rec *kgo.Record, partitions map[string]int) string {
	switch {
	case rec.Topic != e.topic():
		return fmt.Sprintf("topic %s, want %s", rec.Topic, e.topic())
	case string(rec.Key) != e.Key:
		return fmt.Sprintf("key %q, want %q", rec.Key, e.Key)
	case string(rec.Value) != e.Payload:
		return fmt.Sprintf("value %q, want %q", rec.Value, e.Payload)
	case header(rec, "eventType") != e.EventType:
		return fmt.Sprintf("eventType header %q, want %q", header(rec, "eventType"), e.EventType)
	}
	if n := partitions[rec.Topic]; n > 0 {
		if want := javaPartition(rec.Key, n); rec.Partition != want {
			return fmt.Sprintf("partition %d, Java's murmur2 gives %d of %d", rec.Partition, want, n)
		}
	}
	return ""
}

func header(rec *kgo.Record, key string) string {
	for _, h := range rec.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// javaPartition is Kafka's Java default partitioner for a keyed record:
// toPositive(murmur2(key)) % partitions. It is written here independently of
// franz-go, so that the tests check franz-go's hashing rather than reuse it.
func javaPartition(key []byte, partitions int) int32 {
	return int32((murmur2(key) & 0x7fffffff) % int32(partitions))
}

// murmur2 is org.apache.kafka.common.utils.Utils.murmur2.
func murmur2(data []byte) int32 {
	const seed, m, r = uint32(0x9747b28c), uint32(0x5bd1e995), 24
	n := len(data)
	h := seed ^ uint32(n)
	for i := 0; i+4 <= n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := n &^ 3
	switch n % 4 {
	case 3:
		h ^= uint32(data[tail+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[tail+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[tail])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// TestMurmur2MatchesJava checks the reference hash against the vectors in
// Kafka's own UtilsTest.
func TestMurmur2MatchesJava(t *testing.T) {
	for in, want := range map[string]int32{
		"21":                         -973932308,
		"foobar":                     -790332482,
		"a-little-bit-long-string":   -985981536,
		"a-little-bit-longer-string": -1486304829,
		"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
		"abc": 479470107,
	} {
		if got := murmur2([]byte(in)); got != want {
			t.Errorf("murmur2(%q) = %d, want %d", in, got, want)
		}
	}
}
