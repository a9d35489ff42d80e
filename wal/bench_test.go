package wal_test

import (
	"strings"
	"testing"

	"github.com/outboxd/outboxd/wal"
)

// inTransaction returns a decoder that knows the outbox relation and is
// inside a transaction.
func inTransaction(tb testing.TB) *wal.Decoder {
	tb.Helper()
	d := wal.NewDecoder()
	if _, err := d.Decode(0x100, outboxRelation()); err != nil {
		tb.Fatal(err)
	}
	if _, err := d.Decode(0x200, begin(0x900, 0, 7)); err != nil {
		tb.Fatal(err)
	}
	return d
}

// BenchmarkDecodeInsert measures decoding one outbox INSERT message (about
// 250 bytes of payload), the per-event cost of the decoder.
func BenchmarkDecodeInsert(b *testing.B) {
	d := inTransaction(b)
	payload := `{"order_id": 1001, "pad": "` + strings.Repeat("x", 220) + `"}`
	m := []byte(ins(outboxRel, tuple{
		text("7f1c2a9e-2b8e-4c55-9d3e-2a1f0c9b8e01"), text("order"), text("o-42"), text("OrderPlaced"),
		text(payload), null(), text("2024-05-17 09:30:15+00"), text("17"),
	}))
	b.SetBytes(int64(len(m)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Decode(0x300, m); err != nil {
			b.Fatal(err)
		}
	}
}
