package main

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestSeqOf(t *testing.T) {
	for _, tc := range []struct {
		value string
		seq   int
		ok    bool
	}{
		{`{"seq": 12, "data": "ab"}`, 12, true},                                            // jsonb's text form
		{`{"data":"ab","seq":7}`, 7, true},                                                 // Go's json.Marshal of the decoded column
		{`{"payload":{"after":{"payload":"{\"seq\": 345, \"data\": \"x\"}"}}}`, 345, true}, // an envelope with the column as a string
		{`{"data":"ab"}`, 0, false},
		{`{"seq": "x"}`, 0, false},
	} {
		seq, ok := seqOf([]byte(tc.value))
		if seq != tc.seq || ok != tc.ok {
			t.Errorf("seqOf(%s) = %d, %v; want %d, %v", tc.value, seq, ok, tc.seq, tc.ok)
		}
	}
}

func TestIDOf(t *testing.T) {
	const id = "0b7e1e5a-4a4b-4c2d-9f00-1234567890ab"
	for _, tc := range []struct {
		name string
		r    kgo.Record
		want string
	}{
		{"header", kgo.Record{Headers: []kgo.RecordHeader{{Key: "eventType", Value: []byte("x")}, {Key: "id", Value: []byte(id)}}}, id},
		{"value, no header", kgo.Record{Value: []byte(`{"payload":{"after":{"id":"` + id + `","aggregate_id":"a"}}}`)}, id},
		{"neither", kgo.Record{Value: []byte(`{"id":"short"}`)}, ""},
	} {
		got, ok := idOf(&tc.r)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: idOf = %q, %v; want %q", tc.name, got, ok, tc.want)
		}
	}
}

func TestTally(t *testing.T) {
	tl := newTally(4)
	for _, v := range []string{`{"seq": 0}`, `{"seq": 1}`, `{"seq": 1}`, `{"seq": 3}`, `{"seq": 9}`, `{}`} {
		tl.add([]byte(v))
	}
	// seq 2 never came; seq 1 twice; seq 9 is not one of the 4 events and {} has none.
	if missing, repeated := tl.counts(); missing != 1 || repeated != 3 {
		t.Errorf("counts = %d missing, %d repeated; want 1, 3", missing, repeated)
	}
}

func TestPeersBody(t *testing.T) {
	body := peersBody([]result{{Mode: "unavailable", Label: "conduit", Note: "the module proxy refuses it"}})
	if !strings.Contains(body, "- `conduit`: the module proxy refuses it") {
		t.Errorf("body lacks the reason:\n%s", body)
	}
	if peersBody(nil) != "" {
		t.Error("a section with no peer missing")
	}
}
