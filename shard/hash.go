package shard

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// Max is the largest shard count. Each shard is a slot and a walsender, so
// far fewer fit the usual max_replication_slots and max_wal_senders.
const Max = 256

// Of returns the shard, in [0, n), of a row whose key column holds key: the
// first four bytes of md5(key) read as a big-endian unsigned integer, modulo
// n. Postgres computes the same value with Expr when key is the column's text
// in the database encoding, so for non-ASCII keys the database must be UTF8
// (Go strings, and the text outboxd receives, are UTF-8). Of panics if n is
// not in [1, Max].
func Of(key []byte, n int) int {
	checkCount(n)
	sum := md5.Sum(key)
	return int(binary.BigEndian.Uint32(sum[:4]) % uint32(n))
}

// Expr returns a SQL expression, valid in a publication row filter, whose
// value is the shard of the row among n: Of(column's value, n), as an
// integer. column is an identifier of a text or varchar column; it is quoted
// here. Postgres allows only immutable built-in functions in a row filter and
// no coercion through text I/O, so the bytes are taken with
// get_byte(decode(md5(column), 'hex'), b), not with ('x' || md5(...))::bit(32).
// When n divides 256^k for k < 4 only the last k of the four bytes decide
// the remainder, and only those are read (one md5 per row for n = 2, 4, 8,
// 16, ...). Expr panics if n is not in [1, Max].
func Expr(column string, n int) string {
	checkCount(n)
	if n == 1 {
		return "0"
	}
	b := bytesNeeded(n)
	byteOf := func(i int) string {
		return "get_byte(decode(md5(" + quoteIdent(column) + "), 'hex'), " + strconv.Itoa(i) + ")"
	}
	var terms []string
	for i := 4 - b; i < 4; i++ {
		t := byteOf(i)
		if mult := 1 << (8 * (3 - i)); mult > 1 {
			if b == 4 && i == 0 {
				t += "::bigint" // 255 * 2^24 overflows integer
			}
			t += " * " + strconv.Itoa(mult)
		}
		terms = append(terms, t)
	}
	return fmt.Sprintf("mod(%s, %d)", strings.Join(terms, " + "), n)
}

// Filter returns the row filter (without the WHERE and its parentheses)
// that is true for the rows of shard i of n.
func Filter(column string, i, n int) string {
	checkShard(i, n)
	return fmt.Sprintf("%s = %d", Expr(column, n), i)
}

// bytesNeeded is the number of trailing bytes of the four that decide the
// value modulo n: the least k with n dividing 256^k, or 4.
func bytesNeeded(n int) int {
	for k := 1; k < 4; k++ {
		if (1<<(8*k))%n == 0 {
			return k
		}
	}
	return 4
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

// quoteIdent quotes a Postgres identifier.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
