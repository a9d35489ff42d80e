package dlq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/sink"
)

// Read reads the dead-letter topic name from its start to its end when the
// read starts, with isolation.level=read_committed (records of aborted or
// open Kafka transactions are not dead letters yet), and returns its dead
// letters. The end is the high watermark: a Kafka transaction open in the
// topic is waited for. A read that makes no progress for
// kafka.delivery_timeout fails. fallback is as for Build.
func Read(ctx context.Context, cfg config.Kafka, fallback Fallback, name string) (*Topic, error) {
	opts, err := sink.ClientOptions(cfg)
	if err != nil {
		return nil, err
	}
	admin, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("creating a Kafka client to read %s: %w", name, err)
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	lctx, cancel := context.WithTimeout(ctx, cfg.DeliveryTimeout)
	defer cancel()
	starts, err := adm.ListStartOffsets(lctx, name)
	if err == nil {
		err = starts.Error()
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		return nil, fmt.Errorf("the dead-letter topic %q does not exist; check -topic (router.poison.dlq_topic)", name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the start offsets of %s: %w", name, err)
	}
	if err := notCompacted(lctx, adm, name); err != nil {
		return nil, err
	}
	// The high watermarks, not the last stable offsets: a Kafka
	// transaction open when the read starts (the daemon's, in
	// exactly_once) may hold back markers committed after it, which a read
	// to the last stable offset would miss. The read waits for it to end.
	ends, err := adm.ListEndOffsets(lctx, name)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("reading the end offsets of %s: %w", name, err)
	}
	from := map[int32]kgo.Offset{}
	end := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		s, _ := starts.Lookup(name, o.Partition)
		if o.Offset > s.Offset {
			from[o.Partition] = kgo.NewOffset().At(s.Offset)
			end[o.Partition] = o.Offset
		}
	})
	if len(from) == 0 {
		return Build(name, fallback, nil), nil
	}
	cl, err := kgo.NewClient(append(opts,
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(), // the last offset below the end may be a transaction marker
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{name: from}),
	)...)
	if err != nil {
		return nil, fmt.Errorf("creating a Kafka client to read %s: %w", name, err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	progress := time.Now()
	for len(end) > 0 {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = fmt.Errorf("reading %s[%d]: %w", name, p, err)
			}
		})
		if ferr != nil {
			return nil, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			e, ok := end[r.Partition]
			if !ok || r.Offset >= e {
				return
			}
			progress = time.Now()
			if !r.Attrs.IsControl() {
				recs = append(recs, r)
			}
			if r.Offset >= e-1 {
				delete(end, r.Partition)
			}
		})
		if time.Since(progress) > cfg.DeliveryTimeout {
			return nil, stalled(ctx, adm, cfg, name, end)
		}
	}
	return Build(name, fallback, recs), nil
}

// notCompacted refuses a topic whose cleanup.policy includes compact:
// compaction keeps only the last record of a key, so it removes a pending
// dead letter when a later one of the same key arrives, and redrive's
// markers (the letter's key, no value) are tombstones. A principal not
// allowed to describe the topic's configuration is not refused.
func notCompacted(ctx context.Context, adm *kadm.Client, name string) error {
	rcs, err := adm.DescribeTopicConfigs(ctx, name)
	if err != nil {
		return nil
	}
	rc, err := rcs.On(name, nil)
	if err != nil || rc.Err != nil {
		return nil
	}
	for _, c := range rc.Configs {
		if c.Key == "cleanup.policy" && c.Value != nil && strings.Contains(*c.Value, "compact") {
			return fmt.Errorf("the dead-letter topic %s has cleanup.policy=%s: compaction removes a dead letter when a later record of its key "+
				"arrives (another dead letter, or a redrive's marker), so dead letters would be lost; set cleanup.policy=delete "+
				"(kafka-configs --alter --entity-type topics --entity-name %s --add-config cleanup.policy=delete) with a long retention.ms", name, *c.Value, name)
		}
	}
	return nil
}

// stalled is the error of a read that got no records for
// kafka.delivery_timeout before the end of the partitions in end: a Kafka
// transaction still open in them, or partitions that do not answer.
func stalled(ctx context.Context, adm *kadm.Client, cfg config.Kafka, name string, end map[int32]int64) error {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var open []int32
	if lso, err := adm.ListCommittedOffsets(lctx, name); err == nil {
		lso.Each(func(o kadm.ListedOffset) {
			if e, ok := end[o.Partition]; ok && o.Err == nil && o.Offset < e {
				open = append(open, o.Partition)
			}
		})
	}
	if len(open) > 0 {
		slices.Sort(open)
		return fmt.Errorf("reading %s: partitions %v hold a Kafka transaction still open after kafka.delivery_timeout (%s), "+
			"and what it holds back may include dead letters or markers: it is a running outboxd's (it commits soon), or a killed one's "+
			"(Kafka aborts it after kafka.transaction_timeout, or when that outboxd restarts); run the command again then", name, open, cfg.DeliveryTimeout)
	}
	return fmt.Errorf("reading %s: no records for kafka.delivery_timeout (%s) before the end of partitions %v: "+
		"they have no leader or do not answer", name, cfg.DeliveryTimeout, keys(end))
}

func keys(m map[int32]int64) []int32 {
	return slices.Sorted(maps.Keys(m))
}
