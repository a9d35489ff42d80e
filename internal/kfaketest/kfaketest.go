// Package kfaketest holds faults for tests on kfake clusters (franz-go's
// fake Kafka) that more than one package's tests inject.
package kfaketest

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// FailFetches makes c answer every fetch of topic with
// NOT_LEADER_OR_FOLLOWER for d from the first one, as a broker does while a
// partition's leadership moves after a restart. It returns how many fetches
// it failed.
func FailFetches(c *kfake.Cluster, topic string, d time.Duration) *atomic.Int64 {
	var n atomic.Int64
	var until time.Time
	c.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.FetchRequest)
		if until.IsZero() {
			until = time.Now().Add(d)
		}
		if time.Now().After(until) {
			return nil, nil, false
		}
		resp := r.ResponseKind().(*kmsg.FetchResponse)
		for _, rt := range r.Topics {
			if rt.Topic != "" && rt.Topic != topic {
				return nil, nil, false
			}
			st := kmsg.NewFetchResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.NotLeaderForPartition.Code
				sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = -1, -1, -1
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		n.Add(1)
		return resp, nil, true
	})
	return &n
}

// HoldProduce makes c hold every produce request until release is called,
// as a broker that accepts the connection and never answers.
func HoldProduce(c *kfake.Cluster) (release func()) {
	var hold atomic.Bool
	hold.Store(true)
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		c.SleepControl(func() {
			for hold.Load() {
				time.Sleep(5 * time.Millisecond)
			}
		})
		return nil, nil, false
	})
	return func() { hold.Store(false) }
}

// ProduceResponse answers req, a produce request, with code for every
// partition it names.
func ProduceResponse(req kmsg.Request, code int16) *kmsg.ProduceResponse {
	r := req.(*kmsg.ProduceRequest)
	resp := r.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range r.Topics {
		t := kmsg.NewProduceResponseTopic()
		t.Topic, t.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			p := kmsg.NewProduceResponseTopicPartition()
			p.Partition = rp.Partition
			p.ErrorCode = code
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
	return resp
}

// ReadCommitted returns the values of topic's records that a
// read_committed consumer of c sees, read until three polls in a row bring
// nothing.
func ReadCommitted(c *kfake.Cluster, topic string) ([]string, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []string
	for quiet := 0; quiet < 3; {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		if fs.NumRecords() == 0 {
			quiet++
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, string(r.Value)) })
	}
	return out, nil
}
