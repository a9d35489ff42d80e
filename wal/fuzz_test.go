package wal_test

import (
	"errors"
	"testing"

	"github.com/outboxd/outboxd/wal"
)

// FuzzDecode feeds arbitrary bytes to a fresh Decoder and to one that has
// already seen a Relation and a Begin. Decode must never panic, must fail
// only with *wal.DecodeError, and every Change it returns must carry one
// datum per relation column.
//
//	go test -run='^$' -fuzz=FuzzDecode -fuzztime=60s ./wal
func FuzzDecode(f *testing.F) {
	row := tuple{text("e1"), text("order"), text("o-1"), unchanged(), text(`{"a": 1}`), text(`\x00ff`), bin("\x01"), null()}
	for _, m := range []msg{
		begin(0x2000, commitTime, 7),
		commit(0x2000, 0x2010, commitTime),
		outboxRelation(),
		relation(20000, "audit", "log", col{name: "line", oid: oidText}),
		ins(outboxRel, row),
		upd(outboxRel, 0, nil, row),
		upd(outboxRel, 'K', row, row),
		upd(outboxRel, 'O', row, row),
		del(outboxRel, 'K', row),
		del(outboxRel, 'O', row),
		typ(16500, "public", "mood"),
		origin(0x1234, "upstream"),
		truncate(1, outboxRel),
		message(true, 0x1800, "outboxd", "content"),
		message(false, 0, "p", ""),
		msg{'I'}.u32(outboxRel).u8('N').u16(0xffff),
		msg{'R'}.u32(1).str("public").str("outbox").u8('d').u16(0xffff),
	} {
		f.Add([]byte(m))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		fresh := wal.NewDecoder()
		check(t, fresh, data)

		primed := wal.NewDecoder()
		for _, m := range []msg{outboxRelation(), begin(0x2000, commitTime, 7)} {
			if _, err := primed.Decode(0x10, m); err != nil {
				t.Fatalf("priming: %v", err)
			}
		}
		check(t, primed, data)
		// Whatever data did to the decoder's state, it must keep working.
		check(t, primed, ins(outboxRel, row))
		check(t, primed, data)
	})
}

func check(t *testing.T, d *wal.Decoder, data []byte) {
	t.Helper()
	const lsn = wal.LSN(0x42)
	out, err := d.Decode(lsn, data)
	if err != nil {
		var de *wal.DecodeError
		if !errors.As(err, &de) {
			t.Fatalf("Decode(%q) error %T %v, want *wal.DecodeError", data, err, err)
		}
		if de.LSN != lsn {
			t.Fatalf("DecodeError.LSN = %s, want %s", de.LSN, lsn)
		}
		if out != nil {
			t.Fatalf("Decode(%q) returned %#v with an error", data, out)
		}
		return
	}
	switch m := out.(type) {
	case nil, *wal.Begin, *wal.Commit, *wal.Message:
	case *wal.Change:
		if m.Relation == nil {
			t.Fatalf("Change without a relation from %q", data)
		}
		if len(m.Tuple) != len(m.Relation.Columns) {
			t.Fatalf("Change has %d datums, its relation %d columns, from %q", len(m.Tuple), len(m.Relation.Columns), data)
		}
		for i, c := range m.Relation.Columns {
			v, err := c.Value(m.Tuple[i])
			if err == nil && m.Tuple[i].Kind == wal.DatumNull && v != nil {
				t.Fatalf("NULL column %s has value %q", c.Name, v)
			}
		}
	default:
		t.Fatalf("Decode returned unexpected %T", out)
	}
}
