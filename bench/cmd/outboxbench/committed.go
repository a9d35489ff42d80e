package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A consumer reading with isolation.level=read_committed sees a record of a
// Kafka transaction only once the transaction's commit marker is in its
// partition (the last stable offset moves past it), and any other record
// once it is appended. The harness takes that moment from the append times
// (the topics use LogAppendTime, which the markers get too), not from when
// its own consumer happened to fetch the records.

// visibility follows the records of a read_committed consumer that keeps
// control records (kgo.KeepControlRecords), each partition's in offset
// order, and tells when each data record became visible.
type visibility struct {
	pending map[txnKey][]*kgo.Record // records of open transactions
}

// txnKey is one producer's transaction in one partition.
type txnKey struct {
	topic     string
	partition int32
	producer  int64
}

// add takes the next record of its partition and calls visible for every
// data record that it makes visible: itself, when it is not transactional;
// the records of its transaction, when it is a commit marker.
func (v *visibility) add(r *kgo.Record, visible func(r *kgo.Record, at time.Time)) {
	v.addRecord(r, r.Attrs.IsControl(), r.Attrs.IsTransactional(), visible)
}

func (v *visibility) addRecord(r *kgo.Record, control, transactional bool, visible func(r *kgo.Record, at time.Time)) {
	if v.pending == nil {
		v.pending = map[txnKey][]*kgo.Record{}
	}
	k := txnKey{r.Topic, r.Partition, r.ProducerID}
	switch {
	case control:
		rs := v.pending[k]
		delete(v.pending, k)
		if commitMarker(r.Key) {
			for _, p := range rs {
				visible(p, r.Timestamp)
			}
		}
	case transactional:
		v.pending[k] = append(v.pending[k], r)
	default:
		visible(r, r.Timestamp)
	}
}

// commitMarker tells a commit marker's key from an abort marker's: a version
// (int16) and a type (int16), 1 for a commit and 0 for an abort.
func commitMarker(key []byte) bool {
	return len(key) >= 4 && binary.BigEndian.Uint16(key[2:4]) == 1
}

// readCommittedOpts are the options of a consumer that reads as a
// read_committed consumer does and keeps the markers for visibility.
func readCommittedOpts() []kgo.Opt {
	return []kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords()}
}

// committedReader reads the run's topics from base as a read_committed
// consumer: how many records became visible, the first one's append time
// and when the last one became visible.
type committedReader struct {
	cl          *kgo.Client
	vis         visibility
	next        offsets // per partition, the offset after the last record read (markers included)
	records     int
	tally       *tally                            // when set, counts the fill's events among the visible records
	visible     func(r *kgo.Record, at time.Time) // when set, called for each record made visible, with when
	first, last time.Time
}

func newCommittedReader(brokers string, base offsets) (*committedReader, error) {
	parts := map[string]map[int32]kgo.Offset{}
	next := offsets{}
	for t, ps := range base {
		parts[t] = map[int32]kgo.Offset{}
		next[t] = map[int32]int64{}
		for p, off := range ps {
			parts[t][p] = kgo.NewOffset().At(off)
			next[t][p] = off
		}
	}
	cl, err := kgo.NewClient(append(readCommittedOpts(), kgo.SeedBrokers(brokers), kgo.ConsumePartitions(parts))...)
	if err != nil {
		return nil, err
	}
	return &committedReader{cl: cl, next: next}, nil
}

func (c *committedReader) close() { c.cl.Close() }

// poll reads what one fetch returns, waiting at most wait.
func (c *committedReader) poll(ctx context.Context, wait time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	c.cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
		c.next[r.Topic][r.Partition] = r.Offset + 1
		c.vis.add(r, func(r *kgo.Record, at time.Time) {
			c.records++
			if c.tally != nil {
				c.tally.add(r.Value)
			}
			if c.visible != nil {
				c.visible(r, at)
			}
			if c.first.IsZero() || r.Timestamp.Before(c.first) {
				c.first = r.Timestamp
			}
			if at.After(c.last) {
				c.last = at
			}
		})
	})
}

// until polls until done holds, alive fails or timeout passes.
func (c *committedReader) until(ctx context.Context, done func() bool, alive func() error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !done() {
		if err := alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d records visible to a read_committed consumer after %s", c.records, timeout)
		}
		c.poll(ctx, time.Second)
	}
	return nil
}

// reached tells whether every partition has been read up to end.
func (c *committedReader) reached(end offsets) bool {
	for t, ps := range end {
		for p, off := range ps {
			if c.next[t][p] < off {
				return false
			}
		}
	}
	return true
}
