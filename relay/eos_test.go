package relay

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/wal"
)

func TestPositionRoundTrip(t *testing.T) {
	for _, p := range []position{
		{LSN: 0x16B3748},
		{LSN: 0x1_0000_0010, Txn: 0x1_0000_2000, Rows: 1234},
		{LSN: 0x20, Timeline: 3},
		{},
	} {
		got, err := decodePosition(p.encode("outboxd"))
		if err != nil || got != p {
			t.Errorf("decode(encode(%+v)) = %+v, %v", p, got, err)
		}
	}
	for _, bad := range []string{`not json`, `{"lsn": "xyz"}`, `{"lsn": "0/10", "txn": "?"}`} {
		if _, err := decodePosition([]byte(bad)); err == nil {
			t.Errorf("decodePosition(%s) accepted it", bad)
		}
	}
	if p, _ := decodePosition([]byte(`{"lsn":"0/20","slot":"s","at":"x"}`)); p.LSN != wal.LSN(0x20) {
		t.Errorf("lsn 0/20 decoded as %s", p.LSN)
	}
}

// A position written on this server's timeline, or of unknown timeline, is
// taken as it is; one from a later timeline than the server's means an old
// primary, and is refused.
func TestPositionOnThisTimeline(t *testing.T) {
	r := &Relay{timeline: 2}
	r.cfg.Kafka.PositionsTopic = "outboxd-positions"
	for _, pos := range []position{{LSN: 0x100, Timeline: 2}, {LSN: 0x100}} {
		if got, err := r.onThisTimeline(context.Background(), pos); err != nil || got != pos {
			t.Errorf("onThisTimeline(%+v) on timeline 2 = %+v, %v; want it unchanged", pos, got, err)
		}
	}
	if _, err := r.onThisTimeline(context.Background(), position{LSN: 0x100, Timeline: 3}); err == nil ||
		!strings.Contains(err.Error(), "this server is on timeline 2: it is an old primary") {
		t.Errorf("a position from timeline 3 on a server on timeline 2: %v", err)
	}
}
