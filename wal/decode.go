package wal

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// LSN is a Postgres WAL position.
type LSN = pglogrepl.LSN

// Op is the kind of a row change.
type Op byte

// Row change kinds, as pgoutput names them.
const (
	Insert Op = 'I'
	Update Op = 'U'
	Delete Op = 'D'
)

func (o Op) String() string {
	switch o {
	case Insert:
		return "insert"
	case Update:
		return "update"
	case Delete:
		return "delete"
	}
	return fmt.Sprintf("op(%q)", byte(o))
}

// Type OIDs the decoder treats specially.
const (
	OIDBytea = 17
)

// Column describes one column of a relation.
type Column struct {
	Name    string
	TypeOID uint32
	Key     bool // part of the replica identity
}

// Relation is a table as pgoutput last described it. A Relation is never
// modified after the decoder hands it out: a new Relation message for the same
// table (after ALTER TABLE) produces a new value.
type Relation struct {
	ID        uint32
	Namespace string
	Name      string
	Columns   []Column
}

// Index returns the position of the named column, or -1.
func (r *Relation) Index(name string) int {
	for i, c := range r.Columns {
		if c.Name == name {
			return i
		}
	}
	return -1
}

// QualifiedName returns "namespace.name".
func (r *Relation) QualifiedName() string { return r.Namespace + "." + r.Name }

// Datum kinds in a tuple.
const (
	DatumNull      = 'n'
	DatumUnchanged = 'u' // an unchanged TOASTed value in an UPDATE
	DatumText      = 't'
	DatumBinary    = 'b'
)

// Datum is one column value of a tuple, in the form pgoutput sent it.
type Datum struct {
	Kind byte
	Data []byte
}

// Item is one item of the replication stream: *Begin, *Change, *Commit,
// *Message or Keepalive, and nothing else (its method is unexported, as
// pglogrepl's message types are closed). A type switch over an Item reads
// as the protocol.
type Item interface{ item() }

func (*Begin) item()    {}
func (*Commit) item()   {}
func (*Change) item()   {}
func (*Message) item()  {}
func (Keepalive) item() {}

// Begin starts a transaction.
type Begin struct {
	XID        uint32
	FinalLSN   LSN // LSN of the commit record
	CommitTime time.Time
	// SentTime is when the walsender sent the Begin, by Postgres' clock
	// like CommitTime (the send time of its XLogData message). Stream sets
	// it; Decoder leaves it zero.
	SentTime time.Time
}

// Commit ends a transaction.
type Commit struct {
	XID        uint32
	CommitLSN  LSN
	EndLSN     LSN // the position to confirm once the transaction is delivered
	CommitTime time.Time
}

// Change is one row change inside a transaction.
type Change struct {
	Op         Op
	XID        uint32
	LSN        LSN       // WAL position of the message that carried the change
	CommitTime time.Time // of the transaction, from its Begin
	Relation   *Relation
	// Tuple is the new row for Insert and Update, the old row (or its key)
	// for Delete.
	Tuple []Datum
}

// Message is a logical decoding message written with pg_logical_emit_message.
type Message struct {
	XID           uint32 // 0 for a non-transactional message
	LSN           LSN
	Transactional bool
	Prefix        string
	Content       []byte
}

// DecodeError reports pgoutput bytes that cannot be decoded. Nothing after it
// can be trusted: the stream must stop.
type DecodeError struct {
	LSN LSN
	Msg string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("decoding pgoutput message at LSN %s: %s", e.LSN, e.Msg)
}

// Permanent reports that a restart cannot fix it: Postgres decodes the same
// bytes again.
func (e *DecodeError) Permanent() bool { return true }

// Decoder decodes one stream of pgoutput messages. The zero value is not
// usable; call NewDecoder. A Decoder is not safe for concurrent use.
type Decoder struct {
	relations  map[uint32]*Relation
	inTx       bool
	xid        uint32
	commitTime time.Time
	changes    []changeBuf // the unused rest of the current block (see changeBuf)
}

// NewDecoder returns a decoder with an empty relation cache.
func NewDecoder() *Decoder {
	return &Decoder{relations: make(map[uint32]*Relation)}
}

// InTransaction reports whether a Begin has been decoded without its Commit.
func (d *Decoder) InTransaction() bool { return d.inTx }

// aliases reports whether what Decode returns for data refers to data's
// bytes: a row (Insert, Update, Delete) or a logical decoding message.
func aliases(data []byte) bool {
	return len(data) > 0 && (data[0] == 'I' || data[0] == 'U' || data[0] == 'D' || data[0] == 'M')
}

// Decode decodes one pgoutput message that started at WAL position lsn. It
// returns a *Begin, *Change, *Commit or *Message, or nil for messages that only
// update the decoder's state (Relation, Type, Origin, Truncate). For the
// messages aliases reports, what it returns refers to data, which must then
// stay unchanged; the rest is decoded into values of its own.
func (d *Decoder) Decode(lsn LSN, data []byte) (Item, error) {
	r := reader{buf: data}
	if len(data) == 0 {
		return nil, &DecodeError{LSN: lsn, Msg: "empty message"}
	}
	kind := r.byte()
	var (
		msg Item
		err error
	)
	switch kind {
	case 'B':
		msg, err = d.begin(&r)
	case 'C':
		msg, err = d.commit(&r)
	case 'R':
		err = d.relation(&r)
	case 'I', 'U', 'D':
		msg, err = d.change(Op(kind), lsn, &r, len(data))
	case 'M':
		msg, err = d.message(lsn, &r)
	case 'Y':
		r.uint32() // type OID
		r.string() // namespace
		r.string() // name
	case 'O':
		r.uint64() // origin's commit LSN
		r.string() // origin name
	case 'T':
		// A truncate of the outbox removes no committed event from the WAL.
		if !d.inTx {
			err = errors.New("truncate outside a transaction")
		}
		n := int(r.uint32())
		r.byte() // options
		r.bytes(4 * n)
	default:
		err = fmt.Errorf("unknown message type %q", kind)
	}
	if err == nil && r.err != nil {
		err = r.err
	}
	if err != nil {
		return nil, &DecodeError{LSN: lsn, Msg: err.Error()}
	}
	return msg, nil
}

func (d *Decoder) begin(r *reader) (*Begin, error) {
	if d.inTx {
		return nil, errors.New("begin inside an open transaction")
	}
	b := &Begin{FinalLSN: LSN(r.uint64()), CommitTime: pgTime(r.int64()), XID: r.uint32()}
	if r.err != nil {
		return nil, r.err
	}
	d.inTx, d.xid, d.commitTime = true, b.XID, b.CommitTime
	return b, nil
}

func (d *Decoder) commit(r *reader) (*Commit, error) {
	if !d.inTx {
		return nil, errors.New("commit without a begin")
	}
	r.byte() // flags, unused
	c := &Commit{XID: d.xid, CommitLSN: LSN(r.uint64()), EndLSN: LSN(r.uint64()), CommitTime: pgTime(r.int64())}
	if r.err != nil {
		return nil, r.err
	}
	d.inTx, d.xid = false, 0
	return c, nil
}

func (d *Decoder) relation(r *reader) error {
	rel := &Relation{ID: r.uint32(), Namespace: r.string(), Name: r.string()}
	r.byte() // replica identity setting
	n := int(r.uint16())
	if r.err != nil {
		return r.err
	}
	if n > len(r.buf) { // each column needs at least 10 bytes; guards the allocation
		return fmt.Errorf("relation %d declares %d columns in %d bytes", rel.ID, n, len(r.buf))
	}
	rel.Columns = make([]Column, n)
	for i := range rel.Columns {
		flags := r.byte()
		rel.Columns[i] = Column{Name: r.string(), TypeOID: r.uint32(), Key: flags&1 != 0}
		r.uint32() // type modifier
	}
	if r.err != nil {
		return r.err
	}
	d.relations[rel.ID] = rel
	return nil
}

func (d *Decoder) change(op Op, lsn LSN, r *reader, size int) (*Change, error) {
	if !d.inTx {
		return nil, fmt.Errorf("%s outside a transaction", op)
	}
	id := r.uint32()
	rel, ok := d.relations[id]
	if r.err == nil && !ok {
		return nil, fmt.Errorf("%s for relation %d that was never described", op, id)
	}
	// The change and the tuple of a table of up to inlineColumns columns
	// (the common case for an outbox) share one changeBuf.
	cb := d.changeBuf(size)
	*cb = changeBuf{Change: Change{Op: op, XID: d.xid, LSN: lsn, CommitTime: d.commitTime, Relation: rel}}
	c, buf := &cb.Change, cb.buf[:0]
	switch op {
	case Insert:
		if t := r.byte(); t != 'N' && r.err == nil {
			return nil, fmt.Errorf("insert tuple marker %q, want 'N'", t)
		}
		c.Tuple = r.tuple(buf)
	case Update:
		t := r.byte()
		if t == 'K' || t == 'O' {
			r.tuple(nil) // old row or key; outboxd acts on the new row
			t = r.byte()
		}
		if t != 'N' && r.err == nil {
			return nil, fmt.Errorf("update tuple marker %q, want 'N'", t)
		}
		c.Tuple = r.tuple(buf)
	case Delete:
		if t := r.byte(); t != 'K' && t != 'O' && r.err == nil {
			return nil, fmt.Errorf("delete tuple marker %q, want 'K' or 'O'", t)
		}
		c.Tuple = r.tuple(buf)
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(c.Tuple) != len(rel.Columns) {
		return nil, fmt.Errorf("%s on %s has %d columns, its relation has %d", op, rel.QualifiedName(), len(c.Tuple), len(rel.Columns))
	}
	return c, nil
}

func (d *Decoder) message(lsn LSN, r *reader) (*Message, error) {
	m := &Message{Transactional: r.byte()&1 != 0}
	m.LSN = LSN(r.uint64())
	m.Prefix = r.string()
	m.Content = r.bytes(int(r.uint32()))
	if r.err != nil {
		return nil, r.err
	}
	if m.Transactional {
		if !d.inTx {
			return nil, errors.New("transactional message outside a transaction")
		}
		m.XID = d.xid
	}
	if m.LSN == 0 {
		m.LSN = lsn
	}
	return m, nil
}

// Value returns the bytes of d as outboxd delivers them for column c: bytea
// as its raw bytes, every other type as Postgres' text form, byte for byte.
// It returns nil for NULL and an error for an unchanged TOASTed value, whose
// content pgoutput did not send.
func (c Column) Value(d Datum) ([]byte, error) {
	switch d.Kind {
	case DatumNull:
		return nil, nil
	case DatumUnchanged:
		return nil, fmt.Errorf("column %s: unchanged TOAST value was not sent", c.Name)
	case DatumText:
		if c.TypeOID == OIDBytea {
			b, err := decodeBytea(d.Data)
			if err != nil {
				return nil, fmt.Errorf("column %s: %w", c.Name, err)
			}
			return b, nil
		}
		return d.Data, nil
	case DatumBinary:
		return d.Data, nil
	}
	return nil, fmt.Errorf("column %s: unknown datum kind %q", c.Name, d.Kind)
}

func decodeBytea(text []byte) ([]byte, error) {
	if len(text) < 2 || text[0] != '\\' || text[1] != 'x' {
		return nil, errors.New("bytea value is not in hex format; set bytea_output = 'hex' on the server")
	}
	out := make([]byte, hex.DecodedLen(len(text)-2))
	if _, err := hex.Decode(out, text[2:]); err != nil {
		return nil, fmt.Errorf("bytea value: %w", err)
	}
	return out, nil
}

// pgEpoch is 2000-01-01, the origin of Postgres timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func pgTime(us int64) time.Time { return pgEpoch.Add(time.Duration(us) * time.Microsecond) }

// reader reads big-endian fields and remembers the first short read.
type reader struct {
	buf []byte
	err error
}

var errShort = errors.New("message ends early")

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.buf) {
		r.err = errShort
		return nil
	}
	b := r.buf[:n:n]
	r.buf = r.buf[n:]
	return b
}

func (r *reader) byte() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) uint16() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) uint32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) uint64() uint64 {
	if b := r.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *reader) int64() int64 { return int64(r.uint64()) }

func (r *reader) bytes(n int) []byte { return r.take(n) }

func (r *reader) string() string {
	if r.err != nil {
		return ""
	}
	for i, c := range r.buf {
		if c == 0 {
			s := string(r.buf[:i])
			r.buf = r.buf[i+1:]
			return s
		}
	}
	r.err = errors.New("string is not terminated")
	return ""
}

// inlineColumns is how many columns a change holds without a second
// allocation.
const inlineColumns = 8

type changeBuf struct {
	Change
	buf [inlineColumns]Datum
}

// The changes of messages of up to smallMessage bytes are carved from
// blocks of changeBlock: one allocation per changeBlock changes instead of
// one each. A block stays in memory while any of its changes is referred
// to, and with it the messages its changes point into; larger messages'
// changes are allocated alone so that a block never holds on to big ones.
const (
	smallMessage = 1 << 10 // the stream copies bigger ones alone too
	changeBlock  = 32
)

// changeBuf returns room for the change of a message of n bytes.
func (d *Decoder) changeBuf(n int) *changeBuf {
	if n > smallMessage {
		return new(changeBuf)
	}
	if len(d.changes) == 0 {
		d.changes = make([]changeBuf, changeBlock)
	}
	cb := &d.changes[0]
	d.changes = d.changes[1:]
	return cb
}

// tuple reads TupleData into buf when it has room, else into a new slice.
func (r *reader) tuple(buf []Datum) []Datum {
	n := int(r.uint16())
	if r.err != nil {
		return nil
	}
	if n > len(r.buf) { // each column needs at least one byte; guards the allocation
		r.err = fmt.Errorf("tuple declares %d columns in %d bytes", n, len(r.buf))
		return nil
	}
	var t []Datum
	if n <= cap(buf) {
		t = buf[:n]
	} else {
		t = make([]Datum, n)
	}
	for i := range t {
		k := r.byte()
		t[i].Kind = k
		switch k {
		case DatumNull, DatumUnchanged:
		case DatumText, DatumBinary:
			t[i].Data = r.bytes(int(r.uint32()))
		default:
			if r.err == nil {
				r.err = fmt.Errorf("unknown tuple column kind %q", k)
			}
		}
	}
	return t
}
