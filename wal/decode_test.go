package wal_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/golden"

	"github.com/outboxd/outboxd/wal"
)

// step is one message fed to a Decoder at a WAL position.
type step struct {
	lsn  wal.LSN
	data []byte
}

// steps numbers messages at consecutive LSNs starting at 0/1000.
func steps(msgs ...msg) []step {
	out := make([]step, len(msgs))
	for i, m := range msgs {
		out[i] = step{lsn: wal.LSN(0x1000 + 0x10*i), data: []byte(m)}
	}
	return out
}

// micros converts a time to Postgres' microseconds since 2000-01-01.
func micros(t time.Time) int64 {
	return t.Sub(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()
}

var commitTime = micros(time.Date(2024, 5, 17, 9, 30, 15, 123456000, time.UTC))

func TestDecodeGolden(t *testing.T) {
	withTrace := append(append([]col(nil), outboxCols...), col{name: "trace_id", oid: oidText})
	// ALTER TABLE ... ADD COLUMN placed before payload, as a table rebuild
	// might: the column list changes order, not just length.
	reordered := []col{outboxCols[0], outboxCols[1], outboxCols[2], {name: "tenant", oid: oidInt4}, outboxCols[3], outboxCols[4], outboxCols[5], outboxCols[6], outboxCols[7]}

	row := func(id, aggType, aggID, evType, payload, attachment, created, seq datum) tuple {
		return tuple{id, aggType, aggID, evType, payload, attachment, created, seq}
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "full_transaction",
			steps: steps(
				outboxRelation(),
				begin(0x2000, commitTime, 741),
				ins(outboxRel, row(
					text("0b0e7c4e-3f5a-4a8e-9a8e-3c1f7d1b2a01"), text("order"), text("o-1"), text("OrderCreated"),
					text(`{"a": 1, "b": [1, 2]}`), text(`\x00ff10deadbeef`), text("2024-05-17 09:30:15.123456+00"), text("9223372036854775807"))),
				ins(outboxRel, row(
					text("0b0e7c4e-3f5a-4a8e-9a8e-3c1f7d1b2a02"), text("order"), null(), null(),
					null(), null(), text("2024-05-17 09:30:15.5+00"), text("-1"))),
				ins(outboxRel, row(
					text("0b0e7c4e-3f5a-4a8e-9a8e-3c1f7d1b2a03"), text("customer"), text(""), text("Ünïcode ✓"),
					text("{\"nested\": {\"k\": \"v\\n\"},   \"x\": null}"), text(`\x`), text("infinity"), text("0"))),
				ins(outboxRel, row(
					text("0b0e7c4e-3f5a-4a8e-9a8e-3c1f7d1b2a04"), text("order"), text("o-2"), text("Binary"),
					bin("\x01\x00\x02"), bin("\x00\xff"), text("2024-05-17 09:30:16+00"), text("42"))),
				commit(0x2000, 0x2030, commitTime),
			),
		},
		{
			name: "alter_table",
			steps: steps(
				outboxRelation(),
				begin(0x2000, commitTime, 800),
				ins(outboxRel, row(text("e1"), text("order"), text("o-1"), text("A"), text("{}"), null(), null(), text("1"))),
				commit(0x2000, 0x2010, commitTime),
				begin(0x3000, commitTime+1, 801),
				relation(outboxRel, "public", "outbox", withTrace...),
				ins(outboxRel, append(row(text("e2"), text("order"), text("o-1"), text("B"), text("{}"), null(), null(), text("2")), text("trace-9"))),
				commit(0x3000, 0x3010, commitTime+1),
				begin(0x4000, commitTime+2, 802),
				relation(outboxRel, "public", "outbox", reordered...),
				ins(outboxRel, tuple{text("e3"), text("order"), text("o-1"), text("7"), text("C"), text("{}"), null(), null(), text("3")}),
				commit(0x4000, 0x4010, commitTime+2),
			),
		},
		{
			name: "update_delete",
			steps: steps(
				outboxRelation(),
				begin(0x2000, commitTime, 900),
				upd(outboxRel, 0, nil, row(text("e1"), text("order"), text("o-1"), text("A"), text(`{"v": 2}`), null(), null(), text("1"))),
				upd(outboxRel, 'K', row(text("e1"), null(), null(), null(), null(), null(), null(), null()),
					row(text("e1b"), text("order"), text("o-1"), text("A"), unchanged(), unchanged(), null(), text("1"))),
				upd(outboxRel, 'O', row(text("e1"), text("order"), text("o-1"), text("A"), text(`{"v": 1}`), null(), null(), text("1")),
					row(text("e1"), text("order"), text("o-1"), text("A"), text(`{"v": 3}`), null(), null(), text("1"))),
				del(outboxRel, 'K', row(text("e1"), null(), null(), null(), null(), null(), null(), null())),
				del(outboxRel, 'O', row(text("e2"), text("order"), text("o-2"), text("B"), text("{}"), text(`\x01`), null(), text("2"))),
				commit(0x2000, 0x2060, commitTime),
			),
		},
		{
			name: "logical_message",
			steps: steps(
				message(false, 0x1500, "outboxd.heartbeat", ""),
				begin(0x2000, commitTime, 1000),
				message(true, 0x1800, "outboxd", `{"hello": "world"}`),
				message(true, 0, "no-lsn", "\x00\x01binary"),
				message(false, 0x1900, "nontx-inside", "x"),
				commit(0x2000, 0x2040, commitTime),
			),
		},
		{
			name: "state_messages",
			steps: steps(
				outboxRelation(),
				begin(0x2000, commitTime, 1100),
				origin(0x1234, "upstream"),
				typ(16500, "public", "mood"),
				truncate(1, outboxRel),
				ins(outboxRel, row(text("e1"), text("order"), text("o-1"), text("A"), text("{}"), null(), null(), text("1"))),
				commit(0x2000, 0x2050, commitTime),
				typ(16501, "public", "colour"),
			),
		},
		{
			name: "multiple_relations",
			steps: steps(
				outboxRelation(),
				relation(20000, "audit", "log", col{name: "line", oid: oidText}),
				begin(0x2000, commitTime, 1200),
				ins(20000, tuple{text("hello")}),
				ins(outboxRel, row(text("e1"), text("order"), text("o-1"), text("A"), text("{}"), null(), null(), text("1"))),
				commit(0x2000, 0x2020, commitTime),
			),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := wal.NewDecoder()
			var b strings.Builder
			for _, s := range tt.steps {
				out, err := d.Decode(s.lsn, s.data)
				if err != nil {
					t.Fatalf("Decode(%s, %q): %v", s.lsn, s.data, err)
				}
				fmt.Fprintf(&b, "%s %c -> %s", s.lsn, s.data[0], render(out))
			}
			if d.InTransaction() {
				b.WriteString("(transaction still open)\n")
			}
			golden.Check(t, filepath.Join("testdata", tt.name+".golden"), b.String())
		})
	}
}

var typeNames = map[uint32]string{
	oidBool: "bool", oidBytea: "bytea", oidInt8: "int8", oidInt4: "int4", oidText: "text",
	oidTimestamptz: "timestamptz", oidUUID: "uuid", oidJSONB: "jsonb",
}

// render prints a decoded message as stable text for golden files.
func render(out wal.Item) string {
	var b strings.Builder
	switch m := out.(type) {
	case nil:
		b.WriteString("nil\n")
	case *wal.Begin:
		fmt.Fprintf(&b, "begin xid=%d final_lsn=%s commit_time=%s\n", m.XID, m.FinalLSN, m.CommitTime.UTC().Format(time.RFC3339Nano))
	case *wal.Commit:
		fmt.Fprintf(&b, "commit xid=%d commit_lsn=%s end_lsn=%s commit_time=%s\n", m.XID, m.CommitLSN, m.EndLSN, m.CommitTime.UTC().Format(time.RFC3339Nano))
	case *wal.Message:
		fmt.Fprintf(&b, "message xid=%d lsn=%s transactional=%t prefix=%q content=%q\n", m.XID, m.LSN, m.Transactional, m.Prefix, m.Content)
	case *wal.Change:
		r := m.Relation
		fmt.Fprintf(&b, "%s xid=%d lsn=%s relation=%s (id %d, %d columns)\n", m.Op, m.XID, m.LSN, r.QualifiedName(), r.ID, len(r.Columns))
		for i, c := range r.Columns {
			key := " "
			if c.Key {
				key = "*"
			}
			name, ok := typeNames[c.TypeOID]
			if !ok {
				name = fmt.Sprint(c.TypeOID)
			}
			var datum string
			if i < len(m.Tuple) {
				datum = renderDatum(c, m.Tuple[i])
			} else {
				datum = "(missing)"
			}
			fmt.Fprintf(&b, "    %s%-15s %-11s %s\n", key, c.Name, name, datum)
		}
	default:
		fmt.Fprintf(&b, "unexpected %T %+v\n", out, out)
	}
	return b.String()
}

func renderDatum(c wal.Column, d wal.Datum) string {
	v, err := c.Value(d)
	switch {
	case err != nil:
		return fmt.Sprintf("%c %q => error: %v", d.Kind, d.Data, err)
	case v == nil:
		return fmt.Sprintf("%c => NULL", d.Kind)
	}
	return fmt.Sprintf("%c %s => %s", d.Kind, quote(d.Data), quote(v))
}

// quote renders bytes byte by byte: printable ASCII as is, the rest as \xNN,
// so that golden files show exactly which bytes are delivered.
func quote(b []byte) string {
	var s strings.Builder
	s.WriteByte('"')
	for _, c := range b {
		switch {
		case c == '"' || c == '\\':
			s.WriteByte('\\')
			s.WriteByte(c)
		case c >= 0x20 && c < 0x7f:
			s.WriteByte(c)
		default:
			fmt.Fprintf(&s, "\\x%02x", c)
		}
	}
	s.WriteByte('"')
	return s.String()
}

// TestDecodeValues pins the delivered bytes independently of the golden
// files: bytea as raw bytes, jsonb byte for byte.
func TestDecodeValues(t *testing.T) {
	d := wal.NewDecoder()
	mustDecode(t, d, outboxRelation())
	mustDecode(t, d, begin(0x2000, commitTime, 1))
	jsonb := `{"a": 1, "b": [1, 2]}`
	out := mustDecode(t, d, ins(outboxRel, tuple{text("id"), text("t"), text("k"), null(), text(jsonb), text(`\x00ff10`), null(), text("5")}))
	c := out.(*wal.Change)
	for _, tt := range []struct {
		col  string
		want []byte
	}{
		{"payload", []byte(jsonb)},
		{"attachment", []byte{0x00, 0xff, 0x10}},
		{"seq", []byte("5")},
		{"event_type", nil},
		{"created_at", nil},
	} {
		i := c.Relation.Index(tt.col)
		if i < 0 {
			t.Fatalf("relation has no column %s", tt.col)
		}
		got, err := c.Relation.Columns[i].Value(c.Tuple[i])
		if err != nil {
			t.Fatalf("%s: %v", tt.col, err)
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s = %q, want %q", tt.col, got, tt.want)
		}
		if (got == nil) != (tt.want == nil) {
			t.Errorf("%s = %#v, want nil-ness of %#v", tt.col, got, tt.want)
		}
	}
}

// TestDecodeRelationReplaced checks that a Relation message for a known table
// produces a new *Relation and leaves the old value untouched.
func TestDecodeRelationReplaced(t *testing.T) {
	d := wal.NewDecoder()
	mustDecode(t, d, outboxRelation())
	mustDecode(t, d, begin(0x2000, commitTime, 1))
	row := tuple{text("e1"), text("order"), text("o-1"), text("A"), text("{}"), null(), null(), text("1")}
	c1 := mustDecode(t, d, ins(outboxRel, row)).(*wal.Change)
	old := c1.Relation
	snapshot := &wal.Relation{ID: old.ID, Namespace: old.Namespace, Name: old.Name, Columns: append([]wal.Column(nil), old.Columns...)}

	cols := append(append([]col(nil), outboxCols...), col{name: "trace_id", oid: oidText})
	cols[1].name = "kind" // renamed too
	mustDecode(t, d, relation(outboxRel, "public", "outbox", cols...))
	c2 := mustDecode(t, d, ins(outboxRel, append(row, text("t-1")))).(*wal.Change)

	if c2.Relation == old {
		t.Fatal("the insert after a Relation message still points at the old *Relation")
	}
	if !reflect.DeepEqual(old, snapshot) {
		t.Errorf("old relation changed:\n got %+v\nwant %+v", old, snapshot)
	}
	if got := len(c2.Relation.Columns); got != 9 {
		t.Errorf("new relation has %d columns, want 9", got)
	}
	if c2.Relation.Index("trace_id") != 8 || c2.Relation.Index("kind") != 1 || c2.Relation.Index("aggregate_type") != -1 {
		t.Errorf("new relation columns = %+v", c2.Relation.Columns)
	}
	// The old column count no longer fits.
	if _, err := d.Decode(0x5000, ins(outboxRel, row)); err == nil {
		t.Error("an 8-column insert decoded against the 9-column relation")
	}
}

func mustDecode(t *testing.T, d *wal.Decoder, m msg) wal.Item {
	t.Helper()
	out, err := d.Decode(0x1000, m)
	if err != nil {
		t.Fatalf("Decode(%q): %v", []byte(m), err)
	}
	return out
}

func TestColumnValue(t *testing.T) {
	bytea := wal.Column{Name: "attachment", TypeOID: wal.OIDBytea}
	txt := wal.Column{Name: "payload", TypeOID: oidJSONB}
	tests := []struct {
		name    string
		col     wal.Column
		datum   wal.Datum
		want    []byte
		wantErr string
	}{
		{"null", txt, wal.Datum{Kind: wal.DatumNull}, nil, ""},
		{"null bytea", bytea, wal.Datum{Kind: wal.DatumNull}, nil, ""},
		{"text", txt, wal.Datum{Kind: wal.DatumText, Data: []byte(`{"a": 1}`)}, []byte(`{"a": 1}`), ""},
		{"empty text", txt, wal.Datum{Kind: wal.DatumText, Data: []byte{}}, []byte{}, ""},
		{"binary", txt, wal.Datum{Kind: wal.DatumBinary, Data: []byte{1, 2}}, []byte{1, 2}, ""},
		{"bytea hex", bytea, wal.Datum{Kind: wal.DatumText, Data: []byte(`\xDEADbeef00`)}, []byte{0xde, 0xad, 0xbe, 0xef, 0}, ""},
		{"bytea empty", bytea, wal.Datum{Kind: wal.DatumText, Data: []byte(`\x`)}, []byte{}, ""},
		{"bytea binary", bytea, wal.Datum{Kind: wal.DatumBinary, Data: []byte{9}}, []byte{9}, ""},
		{"unchanged toast", txt, wal.Datum{Kind: wal.DatumUnchanged}, nil, "unchanged TOAST"},
		{"unchanged toast bytea", bytea, wal.Datum{Kind: wal.DatumUnchanged}, nil, "unchanged TOAST"},
		{"bytea escape format", bytea, wal.Datum{Kind: wal.DatumText, Data: []byte(`abc\000`)}, nil, "bytea_output"},
		{"bytea backslash only", bytea, wal.Datum{Kind: wal.DatumText, Data: []byte(`\`)}, nil, "bytea_output"},
		{"bytea empty text", bytea, wal.Datum{Kind: wal.DatumText, Data: []byte{}}, nil, "bytea_output"},
		{"bytea odd length", bytea, wal.Datum{Kind: wal.DatumText, Data: []byte(`\xabc`)}, nil, "bytea value"},
		{"bytea bad digit", bytea, wal.Datum{Kind: wal.DatumText, Data: []byte(`\xzz`)}, nil, "bytea value"},
		{"unknown kind", txt, wal.Datum{Kind: 'q'}, nil, "unknown datum kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.col.Value(tt.datum)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Value() = %q, %v; want error containing %q", got, err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.col.Name) {
					t.Errorf("error %q does not name column %s", err, tt.col.Name)
				}
				return
			}
			if err != nil {
				t.Fatalf("Value(): %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) || (got == nil) != (tt.want == nil) {
				t.Errorf("Value() = %#v, want %#v", got, tt.want)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	rel := outboxRelation()
	b := begin(0x2000, commitTime, 5)
	row := tuple{text("e1"), text("order"), text("o-1"), text("A"), text("{}"), null(), null(), text("1")}
	tests := []struct {
		name    string
		prefix  []msg // decoded first, must succeed
		data    []byte
		wantErr string
	}{
		{"nil data", nil, nil, "empty message"},
		{"empty data", nil, []byte{}, "empty message"},
		{"unknown type", nil, []byte("Zxyz"), "unknown message type 'Z'"},
		{"unknown type zero byte", nil, []byte{0}, "unknown message type"},
		{"stream start (protocol v2)", nil, []byte{'S', 0, 0, 0, 1, 1}, "unknown message type 'S'"},

		{"insert undescribed relation", []msg{b}, ins(99, row), "relation 99 that was never described"},
		{"update undescribed relation", []msg{b}, upd(99, 0, nil, row), "never described"},
		{"delete undescribed relation", []msg{b}, del(99, 'K', row), "never described"},
		{"insert outside transaction", []msg{rel}, ins(outboxRel, row), "insert outside a transaction"},
		{"update outside transaction", []msg{rel}, upd(outboxRel, 0, nil, row), "update outside a transaction"},
		{"delete outside transaction", []msg{rel}, del(outboxRel, 'K', row), "delete outside a transaction"},
		{"insert after commit", []msg{rel, b, commit(0x2000, 0x2010, 0)}, ins(outboxRel, row), "outside a transaction"},
		{"begin inside transaction", []msg{b}, begin(0x3000, 0, 6), "begin inside an open transaction"},
		{"commit without begin", nil, commit(0x2000, 0x2010, 0), "commit without a begin"},
		{"second commit", []msg{b, commit(0x2000, 0x2010, 0)}, commit(0x2000, 0x2010, 0), "commit without a begin"},
		{"transactional message outside transaction", nil, message(true, 0x10, "p", "c"), "transactional message outside a transaction"},
		{"truncate outside transaction", []msg{rel}, truncate(0, outboxRel), "outside a transaction"},

		{"insert too few columns", []msg{rel, b}, ins(outboxRel, row[:7]), "has 7 columns, its relation has 8"},
		{"insert too many columns", []msg{rel, b}, ins(outboxRel, append(row[:8:8], null())), "has 9 columns, its relation has 8"},
		{"insert no columns", []msg{rel, b}, ins(outboxRel, tuple{}), "has 0 columns"},
		{"update too few columns", []msg{rel, b}, upd(outboxRel, 'O', row, row[:1]), "has 1 columns"},
		{"delete too few columns", []msg{rel, b}, del(outboxRel, 'K', row[:1]), "has 1 columns"},

		{"relation unterminated namespace", nil, msg{'R'}.u32(1).raw([]byte("public")), "not terminated"},
		{"relation unterminated name", nil, msg{'R'}.u32(1).str("public").raw([]byte("outbox")), "not terminated"},
		{"relation unterminated column name", nil, msg{'R'}.u32(1).str("public").str("outbox").u8('d').u16(1).u8(0).raw([]byte("id")), "not terminated"},
		{"message unterminated prefix", []msg{b}, msg{'M'}.u8(1).u64(0).raw([]byte("prefix")), "not terminated"},

		{"relation huge column count", nil, msg{'R'}.u32(1).str("public").str("outbox").u8('d').u16(0xffff), "declares 65535 columns"},
		{"relation column count beyond data", nil, msg{'R'}.u32(1).str("p").str("t").u8('d').u16(3).u8(0).str("a").u32(25).u32(0), "ends early"},
		{"tuple huge column count", []msg{rel, b}, msg{'I'}.u32(outboxRel).u8('N').u16(0xffff), "tuple declares 65535 columns"},
		{"tuple huge datum length", []msg{rel, b}, msg{'I'}.u32(outboxRel).u8('N').u16(1).u8('t').u32(0xffffffff), "ends early"},
		{"message huge content length", []msg{b}, msg{'M'}.u8(1).u64(0).str("p").u32(0xffffffff).raw([]byte("abc")), "ends early"},

		{"insert bad marker", []msg{rel, b}, msg{'I'}.u32(outboxRel).u8('K').tup(row), "insert tuple marker 'K'"},
		{"update bad marker", []msg{rel, b}, msg{'U'}.u32(outboxRel).u8('X').tup(row), "update tuple marker 'X'"},
		{"update bad marker after old", []msg{rel, b}, msg{'U'}.u32(outboxRel).u8('O').tup(row).u8('O').tup(row), "update tuple marker 'O'"},
		{"delete bad marker", []msg{rel, b}, msg{'D'}.u32(outboxRel).u8('N').tup(row), "delete tuple marker 'N'"},
		{"bad datum kind", []msg{rel, b}, msg{'I'}.u32(outboxRel).u8('N').u16(1).u8('x'), "unknown tuple column kind 'x'"},
		{"bad datum kind in old tuple", []msg{rel, b}, msg{'U'}.u32(outboxRel).u8('K').u16(1).u8('z').u8('N').tup(row), "unknown tuple column kind 'z'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := wal.NewDecoder()
			for _, p := range tt.prefix {
				if _, err := d.Decode(0x100, p); err != nil {
					t.Fatalf("prefix %q: %v", []byte(p), err)
				}
			}
			const at = wal.LSN(0xABCDEF)
			checkDecodeError(t, d, at, tt.data, tt.wantErr)
		})
	}
}

// checkDecodeError decodes data at lsn and requires a *wal.DecodeError
// carrying lsn whose text contains want.
func checkDecodeError(t *testing.T, d *wal.Decoder, lsn wal.LSN, data []byte, want string) {
	t.Helper()
	inTx := d.InTransaction()
	out, err := d.Decode(lsn, data)
	var de *wal.DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("Decode(%q) = %#v, %v; want a *wal.DecodeError", data, out, err)
	}
	if out != nil {
		t.Errorf("Decode(%q) returned %#v along with an error", data, out)
	}
	if de.LSN != lsn {
		t.Errorf("DecodeError.LSN = %s, want %s", de.LSN, lsn)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}
	if !strings.Contains(err.Error(), lsn.String()) {
		t.Errorf("error %q does not name LSN %s", err, lsn)
	}
	if d.InTransaction() != inTx {
		t.Errorf("a failed decode changed InTransaction from %t to %t", inTx, d.InTransaction())
	}
}

// TestDecodeTruncated cuts every valid message at every length and requires a
// DecodeError for each cut.
func TestDecodeTruncated(t *testing.T) {
	rel := outboxRelation()
	b := begin(0x2000, commitTime, 5)
	row := tuple{text("e1"), text("order"), text("o-1"), unchanged(), text("{}"), null(), bin("\x01"), text("1")}
	tests := []struct {
		name   string
		prefix []msg
		m      msg
	}{
		{"begin", nil, b},
		{"commit", []msg{b}, commit(0x2000, 0x2010, commitTime)},
		{"relation", nil, rel},
		{"insert", []msg{rel, b}, ins(outboxRel, row)},
		{"update", []msg{rel, b}, upd(outboxRel, 0, nil, row)},
		{"update with key", []msg{rel, b}, upd(outboxRel, 'K', row, row)},
		{"update with old", []msg{rel, b}, upd(outboxRel, 'O', row, row)},
		{"delete key", []msg{rel, b}, del(outboxRel, 'K', row)},
		{"delete old", []msg{rel, b}, del(outboxRel, 'O', row)},
		{"transactional message", []msg{b}, message(true, 0x1800, "outboxd", "content")},
		{"message", nil, message(false, 0x1800, "outboxd", "content")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for n := 1; n < len(tt.m); n++ {
				d := wal.NewDecoder()
				for _, p := range tt.prefix {
					if _, err := d.Decode(0x100, p); err != nil {
						t.Fatalf("prefix %q: %v", []byte(p), err)
					}
				}
				checkDecodeError(t, d, 0x2a, []byte(tt.m[:n]), "")
			}
			// The whole message decodes.
			d := wal.NewDecoder()
			for _, p := range tt.prefix {
				mustDecode(t, d, p)
			}
			mustDecode(t, d, tt.m)
		})
	}
}

// TestDecodeTruncatedStateMessages requires truncated Type, Origin and
// Truncate messages to be decode errors too, like every other type: bytes
// that do not parse mean the stream is corrupt, whatever the message carries.
func TestDecodeTruncatedStateMessages(t *testing.T) {
	b := begin(0x2000, commitTime, 5)
	tests := []struct {
		name string
		m    msg
	}{
		{"type", typ(16500, "public", "mood")},
		{"origin", origin(0x1234, "upstream")},
		{"truncate", truncate(1, outboxRel, 16385)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The whole message decodes, inside a transaction.
			d := wal.NewDecoder()
			mustDecode(t, d, b)
			mustDecode(t, d, tt.m)
			var accepted []int
			for n := 1; n < len(tt.m); n++ {
				d := wal.NewDecoder()
				mustDecode(t, d, b)
				_, err := d.Decode(0x2a, tt.m[:n])
				var de *wal.DecodeError
				if !errors.As(err, &de) {
					accepted = append(accepted, n)
				}
			}
			if len(accepted) > 0 {
				t.Errorf("%q cut to %v of its %d bytes decodes without a *wal.DecodeError", []byte(tt.m), accepted, len(tt.m))
			}
		})
	}
}

func TestOpString(t *testing.T) {
	for op, want := range map[wal.Op]string{wal.Insert: "insert", wal.Update: "update", wal.Delete: "delete", wal.Op('X'): "op('X')"} {
		if got := op.String(); got != want {
			t.Errorf("Op(%q).String() = %q, want %q", byte(op), got, want)
		}
	}
}

func TestDecoderInstancesAreIndependent(t *testing.T) {
	a, b := wal.NewDecoder(), wal.NewDecoder()
	mustDecode(t, a, outboxRelation())
	mustDecode(t, a, begin(0x2000, 0, 1))
	mustDecode(t, b, begin(0x2000, 0, 1))
	if _, err := b.Decode(0x10, ins(outboxRel, tuple{})); err == nil {
		t.Fatal("decoder b knows a relation only decoder a was told about")
	}
	if !a.InTransaction() || !b.InTransaction() {
		t.Fatal("InTransaction is false after Begin")
	}
}

// TestDecodedChangesStayPut requires every change the decoder returns to
// keep its own row while later ones are decoded (changes of small messages
// share blocks), and big messages' changes as well as small ones.
func TestDecodedChangesStayPut(t *testing.T) {
	d := inTransaction(t)
	var changes []*wal.Change
	var ids []string
	for i := range 100 {
		id := strings.Repeat("x", i%7*2000) + string(rune('a'+i%26)) + strings.Repeat("y", i)
		m := []byte(ins(outboxRel, tuple{
			text(id), text("order"), text("o-42"), text("OrderPlaced"),
			text("{}"), null(), text("2024-05-17 09:30:15+00"), text("17"),
		}))
		out, err := d.Decode(wal.LSN(0x300+i), m)
		if err != nil {
			t.Fatal(err)
		}
		changes, ids = append(changes, out.(*wal.Change)), append(ids, id)
	}
	for i, c := range changes {
		if c.LSN != wal.LSN(0x300+i) || string(c.Tuple[0].Data) != ids[i] {
			t.Errorf("change %d now has LSN %s and id of %d bytes, want %s and %d", i, c.LSN, len(c.Tuple[0].Data), wal.LSN(0x300+i), len(ids[i]))
		}
	}
}

// TestAliasesNamesEveryMessageThatKeepsItsBytes decodes a stream of every
// message kind from one reused buffer, as the stream does for the messages
// aliases says are not kept, and requires the outcome to read as it does
// from copies: a message whose decoded form refers to its bytes must be
// one that aliases reports.
func TestAliasesNamesEveryMessageThatKeepsItsBytes(t *testing.T) {
	row := tuple{
		text("7f1c2a9e-2b8e-4c55-9d3e-2a1f0c9b8e01"), text("order"), text("o-42"), text("OrderPlaced"),
		text(`{"a": 1}`), null(), text("2024-05-17 09:30:15+00"), text("17"),
	}
	msgs := []msg{
		typ(600, "public", "mood"), outboxRelation(), origin(0x50, "upstream"), begin(0x900, 0, 7),
		ins(outboxRel, row), upd(outboxRel, 'K', row, row), del(outboxRel, 'K', row),
		message(true, 0x300, "outbox", `{"id": "m1"}`), truncate(0, outboxRel), commit(0x800, 0x900, 0),
	}
	decodeAll := func(reuse bool) string {
		d := wal.NewDecoder()
		var outs []wal.Item
		buf := make([]byte, 0, 4096)
		for i, m := range msgs {
			data := []byte(m)
			if reuse && !wal.Aliases(data) {
				buf = append(buf[:0], m...)
				data = buf
			}
			out, err := d.Decode(wal.LSN(0x100+i), data)
			if err != nil {
				t.Fatalf("message %c: %v", m[0], err)
			}
			if reuse && !wal.Aliases(data) {
				for j := range buf {
					buf[j] = 0xFF // the connection's next read
				}
			}
			outs = append(outs, out)
		}
		var b strings.Builder
		for _, out := range outs {
			b.WriteString(render(out))
		}
		return b.String()
	}
	if got, want := decodeAll(true), decodeAll(false); got != want {
		t.Errorf("decoding from a reused buffer gave\n%s\nwant\n%s", got, want)
	}
}
