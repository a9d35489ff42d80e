package dlq

import (
	"context"
	"errors"
	"fmt"
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
// letters. A read that makes no progress for kafka.delivery_timeout fails.
func Read(ctx context.Context, cfg config.Kafka, idHeader, name string) (*Topic, error) {
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
	ends, err := adm.ListCommittedOffsets(lctx, name) // the last stable offsets
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
		return Build(name, idHeader, nil), nil
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
			return nil, fmt.Errorf("reading %s: no records for kafka.delivery_timeout (%s) before the end of partitions %v: "+
				"they have no leader or do not answer", name, cfg.DeliveryTimeout, keys(end))
		}
	}
	return Build(name, idHeader, recs), nil
}

func keys(m map[int32]int64) []int32 {
	var out []int32
	for k := range m {
		out = append(out, k)
	}
	return out
}
