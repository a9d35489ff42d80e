package test

import (
	"slices"
	"testing"
	"time"
)

// A new aggregate type meets its topic missing: outboxd creates it and waits
// for its partitions' leaders, and the first record is in Kafka within a
// second of its row's commit. On the test bed that takes about 60 ms; it took
// about 300 ms while the wait for leaders read franz-go's metadata cache
// (250 ms old at most) and the first produce waited out franz-go's 250 ms
// retry backoff, which in a catch-up across new aggregate types added up to
// seconds.
func TestFirstRecordOfANewTopic(t *testing.T) {
	d := newDB(t)
	p := start(t, d.env())
	p.waitStreaming()
	warm := d.name + "_warm"
	id, _ := insertEvent(t, d, warm, "k", `{}`)
	readUntil(t, []string{warm + "-events"}, 30*time.Second, 0, waitIDs(id))
	var lat []float64
	for i := range 3 {
		typ := d.name + "_new" + string(rune('a'+i))
		before, _ := p.metric("outboxd_sink_commit_to_ack_seconds_sum")
		id, _ := insertEvent(t, d, typ, "k", `{}`)
		readUntil(t, []string{typ + "-events"}, 30*time.Second, 0, waitIDs(id))
		var after float64
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if after, _ = p.metric("outboxd_sink_commit_to_ack_seconds_sum"); after != before {
				break
			}
		}
		lat = append(lat, after-before)
	}
	t.Logf("commit to acknowledgement of the first record of a new topic: %.3f s", lat)
	slices.Sort(lat)
	if lat[1] > 1 {
		t.Errorf("the first record of a new topic took %.3f s (median of 3) from commit to acknowledgement, want under 1 s", lat[1])
	}
}
