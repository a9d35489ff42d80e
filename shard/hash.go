package shard

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"strconv"

	"github.com/outboxd/outboxd/internal/quote"
)

// Max is the largest shard count. Each shard is a slot and a walsender, so
// far fewer fit the usual max_replication_slots and max_wal_senders.
const Max = 256

// Of returns the shard, in [0, n), of a row whose key column holds key:
// Postgres' hashtext(key) read as an unsigned 32-bit integer, modulo n. The
// row filters compute the same value with Expr. Of agrees with Postgres when
// the server is little-endian, the key column's collation is deterministic,
// and key is the column's text in the database encoding, so for non-ASCII
// keys the database must be UTF8 (Go strings, and the text outboxd receives,
// are UTF-8); ProbeCollatedSQL and VerifyProbe check all three. Of panics if
// n is not in [1, Max].
func Of(key []byte, n int) int {
	checkCount(n)
	return int(uint32(Hashtext(key)) % uint32(n))
}

// Hashtext returns what Postgres' hashtext() returns for a text value whose
// bytes are key, under a deterministic collation, on a little-endian server:
// hash_bytes (src/common/hashfn.c), Bob Jenkins' lookup3 hash of the bytes,
// as a signed integer.
func Hashtext(key []byte) int32 { return int32(hashBytes(key)) }

// hashBytes is Postgres' hash_bytes on a little-endian machine. Its aligned
// and unaligned paths give the same value there; this is the unaligned one.
func hashBytes(k []byte) uint32 {
	a := 0x9e3779b9 + uint32(len(k)) + 3923095
	b, c := a, a
	for len(k) >= 12 {
		a += binary.LittleEndian.Uint32(k)
		b += binary.LittleEndian.Uint32(k[4:])
		c += binary.LittleEndian.Uint32(k[8:])
		a, b, c = mix(a, b, c)
		k = k[12:]
	}
	// The last 11 bytes; the lowest byte of c is left for the length, as
	// in Postgres, which adds the length to c only through the initial value.
	switch len(k) {
	case 11:
		c += uint32(k[10]) << 24
		fallthrough
	case 10:
		c += uint32(k[9]) << 16
		fallthrough
	case 9:
		c += uint32(k[8]) << 8
		fallthrough
	case 8:
		b += uint32(k[7]) << 24
		fallthrough
	case 7:
		b += uint32(k[6]) << 16
		fallthrough
	case 6:
		b += uint32(k[5]) << 8
		fallthrough
	case 5:
		b += uint32(k[4])
		fallthrough
	case 4:
		a += uint32(k[3]) << 24
		fallthrough
	case 3:
		a += uint32(k[2]) << 16
		fallthrough
	case 2:
		a += uint32(k[1]) << 8
		fallthrough
	case 1:
		a += uint32(k[0])
	}
	return final(a, b, c)
}

func mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func final(a, b, c uint32) uint32 {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}

// Expr returns a SQL expression, valid in a publication row filter, whose
// value is the shard of the row among n: Of(column's value, n), as an
// integer. column is an identifier of a text or varchar column; it is quoted
// here. The expression widens hashtext's value to bigint and masks it to its
// unsigned 32 bits before the remainder, for every n: for a power of two,
// masking the low bits of the integer itself is no cheaper per row. Expr
// panics if n is not in [1, Max].
func Expr(column string, n int) string {
	checkCount(n)
	if n == 1 {
		return "0"
	}
	return "mod(hashtext(" + quote.Ident(column) + ")::bigint & 4294967295, " + strconv.Itoa(n) + ")"
}

// Filter returns the row filter (without the WHERE and its parentheses)
// that is true for the rows of shard i of n. A row whose key is NULL has no
// hash (Expr is NULL for it, and a NULL filter publishes nothing), so shard
// 0's filter also takes the rows with a NULL key, as MessageOwner gives it
// the messages without one: each such row reaches a pipeline, which applies
// router.require_key as an unsharded outboxd does. The filters before this
// rule took a NULL key nowhere; FilterCheckSQL finds them.
func Filter(column string, i, n int) string {
	checkShard(i, n)
	f := fmt.Sprintf("%s = %d", Expr(column, n), i)
	if i == 0 && n > 1 {
		f = quote.Ident(column) + " IS NULL OR " + f
	}
	return f
}

func checkCount(n int) {
	if n < 1 || n > Max {
		panic(fmt.Sprintf("shard: count %d is not in [1, %d]", n, Max))
	}
}

func checkShard(i, n int) {
	checkCount(n)
	if i < 0 || i >= n {
		panic(fmt.Sprintf("shard: index %d is not in [0, %d)", i, n))
	}
}
