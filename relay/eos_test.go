package relay

import (
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

// A position written on this server's timeline, or of unknown timeline, and
// within its WAL is taken as it is; one from an earlier timeline is checked
// against the timeline's history; one from a later timeline (an old primary)
// or past the server's WAL (a restored backup) is refused.
func TestCheckPosition(t *testing.T) {
	for _, c := range []struct {
		pos     position
		history bool
		err     string
	}{
		{pos: position{LSN: 0x100, Timeline: 2}},
		{pos: position{LSN: 0x100}},
		{pos: position{LSN: 0x100, Timeline: 1}, history: true},
		{pos: position{LSN: 0x100, Timeline: 3}, err: "this server is on timeline 2: it is an old primary"},
		{pos: position{LSN: 0x2000, Timeline: 2}, err: "(LSN 0/2000) is past this server's WAL (0/1000): the database was restored from a backup"},
		{pos: position{LSN: 0x2000}, err: "is past this server's WAL"},
	} {
		history, err := checkPosition(c.pos, 2, 0x1000, "outboxd-positions")
		if history != c.history || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("checkPosition(%+v) on timeline 2, WAL at 0/1000 = %v, %v; want %v, %q", c.pos, history, err, c.history, c.err)
		}
	}
}
