package relay

import (
	"testing"

	"github.com/outboxd/outboxd/wal"
)

func TestPositionRoundTrip(t *testing.T) {
	for _, p := range []position{
		{LSN: 0x16B3748},
		{LSN: 0x1_0000_0010, Txn: 0x1_0000_2000, Rows: 1234},
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
