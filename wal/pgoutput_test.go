package wal_test

import (
	"encoding/binary"
)

// This file builds pgoutput protocol-version-1 messages for the decoder
// tests. Field order follows the PostgreSQL "Logical Replication Message
// Formats" chapter.

// msg appends big-endian fields to a message.
type msg []byte

func (m msg) u8(v byte) msg    { return append(m, v) }
func (m msg) u16(v uint16) msg { return binary.BigEndian.AppendUint16(m, v) }
func (m msg) u32(v uint32) msg { return binary.BigEndian.AppendUint32(m, v) }
func (m msg) u64(v uint64) msg { return binary.BigEndian.AppendUint64(m, v) }
func (m msg) str(s string) msg { return append(append(m, s...), 0) }
func (m msg) raw(b []byte) msg { return append(m, b...) }
func (m msg) tup(t tuple) msg  { return t.appendTo(m) }

// datum is one TupleData column.
type datum struct {
	kind byte
	data string
}

func null() datum         { return datum{kind: 'n'} }
func unchanged() datum    { return datum{kind: 'u'} }
func text(s string) datum { return datum{kind: 't', data: s} }
func bin(s string) datum  { return datum{kind: 'b', data: s} }

type tuple []datum

func (t tuple) appendTo(m msg) msg {
	m = m.u16(uint16(len(t)))
	for _, d := range t {
		m = m.u8(d.kind)
		if d.kind == 't' || d.kind == 'b' {
			m = m.u32(uint32(len(d.data))).raw([]byte(d.data))
		}
	}
	return m
}

// col is one column of a Relation message.
type col struct {
	name string
	oid  uint32
	key  bool
}

// Type OIDs used in the tests.
const (
	oidBool        = 16
	oidBytea       = 17
	oidInt8        = 20
	oidInt4        = 23
	oidText        = 25
	oidTimestamptz = 1184
	oidUUID        = 2950
	oidJSONB       = 3802
)

func begin(finalLSN uint64, micros int64, xid uint32) msg {
	return msg{'B'}.u64(finalLSN).u64(uint64(micros)).u32(xid)
}

func commit(commitLSN, endLSN uint64, micros int64) msg {
	return msg{'C'}.u8(0).u64(commitLSN).u64(endLSN).u64(uint64(micros))
}

func relation(id uint32, ns, name string, cols ...col) msg {
	m := msg{'R'}.u32(id).str(ns).str(name).u8('d').u16(uint16(len(cols)))
	for _, c := range cols {
		var flags byte
		if c.key {
			flags = 1
		}
		m = m.u8(flags).str(c.name).u32(c.oid).u32(0xffffffff)
	}
	return m
}

func ins(rel uint32, t tuple) msg { return msg{'I'}.u32(rel).u8('N').tup(t) }

// update builds an Update; oldKind is 0 (no old tuple), 'K' or 'O'.
func upd(rel uint32, oldKind byte, old, new tuple) msg {
	m := msg{'U'}.u32(rel)
	if oldKind != 0 {
		m = m.u8(oldKind).tup(old)
	}
	return m.u8('N').tup(new)
}

func del(rel uint32, kind byte, old tuple) msg { return msg{'D'}.u32(rel).u8(kind).tup(old) }

func typ(oid uint32, ns, name string) msg { return msg{'Y'}.u32(oid).str(ns).str(name) }

func origin(lsn uint64, name string) msg { return msg{'O'}.u64(lsn).str(name) }

func truncate(options byte, rels ...uint32) msg {
	m := msg{'T'}.u32(uint32(len(rels))).u8(options)
	for _, r := range rels {
		m = m.u32(r)
	}
	return m
}

func message(transactional bool, lsn uint64, prefix, content string) msg {
	var flags byte
	if transactional {
		flags = 1
	}
	return msg{'M'}.u8(flags).u64(lsn).str(prefix).u32(uint32(len(content))).raw([]byte(content))
}

// The outbox table most tests use.
const outboxRel = 16384

var outboxCols = []col{
	{name: "id", oid: oidUUID, key: true},
	{name: "aggregate_type", oid: oidText},
	{name: "aggregate_id", oid: oidText},
	{name: "event_type", oid: oidText},
	{name: "payload", oid: oidJSONB},
	{name: "attachment", oid: oidBytea},
	{name: "created_at", oid: oidTimestamptz},
	{name: "seq", oid: oidInt8},
}

func outboxRelation() msg { return relation(outboxRel, "public", "outbox", outboxCols...) }
