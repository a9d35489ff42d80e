package main

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestVisibility(t *testing.T) {
	at := func(ms int) time.Time { return time.UnixMilli(int64(ms)) }
	rec := func(partition int32, producer int64, ms int, key string) *kgo.Record {
		return &kgo.Record{Topic: "t", Partition: partition, ProducerID: producer, Timestamp: at(ms), Key: []byte(key)}
	}
	commit, abort := string([]byte{0, 0, 0, 1}), string([]byte{0, 0, 0, 0})
	type in struct {
		r                      *kgo.Record
		control, transactional bool
	}
	var v visibility
	got := map[string]time.Time{}
	for _, x := range []in{
		{rec(0, 1, 10, "a"), false, true},
		{rec(1, 1, 11, "b"), false, true},
		{rec(0, 2, 12, "plain"), false, false}, // not transactional: visible when appended
		{rec(0, 1, 15, commit), true, false},   // a commits at 15
		{rec(0, 1, 20, "c"), false, true},
		{rec(0, 1, 25, abort), true, false}, // c is aborted: never visible
		{rec(1, 1, 30, commit), true, false},
	} {
		v.addRecord(x.r, x.control, x.transactional, func(r *kgo.Record, at time.Time) {
			if _, dup := got[string(r.Key)]; dup {
				t.Errorf("%s visible twice", r.Key)
			}
			got[string(r.Key)] = at
		})
	}
	want := map[string]time.Time{"a": at(15), "b": at(30), "plain": at(12)}
	if len(got) != len(want) {
		t.Errorf("visible: %v, want %v", got, want)
	}
	for k, w := range want {
		if !got[k].Equal(w) {
			t.Errorf("%s visible at %v, want %v", k, got[k], w)
		}
	}
}
