package shard

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxIdentifier is Postgres' identifier length in bytes (NAMEDATALEN - 1).
// Postgres truncates a longer publication name with only a notice, and two
// shards' names could then collide, so Name refuses it instead.
const MaxIdentifier = 63

// Name returns the name of shard i of n's slot or publication, given the
// configured base name: base itself when n is 1 (an unsharded outboxd keeps
// its names, so sharding can start from an existing slot), else
// base_<i>of<n>, e.g. outboxd_0of4. It returns an error, naming what to
// shorten, when the name exceeds MaxIdentifier bytes, or when base itself
// parses as a shard name (two layouts' names could then be mistaken for
// each other). Name panics if i is not in [0, n) or n not in [1, Max].
func Name(base string, i, n int) (string, error) {
	checkShard(i, n)
	if _, _, _, ok := split(base); ok {
		return "", fmt.Errorf("%q ends like a shard name (_<i>of<n>); choose a base name that does not, since shard names are made by appending that suffix", base)
	}
	if n == 1 {
		return base, nil
	}
	name := base + "_" + strconv.Itoa(i) + "of" + strconv.Itoa(n)
	if len(name) > MaxIdentifier {
		room := MaxIdentifier - (len(name) - len(base))
		return "", fmt.Errorf("%q, the name of shard %d of %d, is %d bytes, longer than Postgres' %d-byte identifiers; shorten %q to at most %d bytes",
			name, i, n, len(name), MaxIdentifier, base, room)
	}
	return name, nil
}

// Names returns the names of the n shards for base, in shard order, or the
// first error Name returns.
func Names(base string, n int) ([]string, error) {
	checkCount(n)
	out := make([]string, n)
	for i := range out {
		name, err := Name(base, i, n)
		if err != nil {
			return nil, err
		}
		out[i] = name
	}
	return out, nil
}

// Parse reports whether name is the name of a shard of base, and which:
// base itself is shard 0 of 1; base_<i>of<n> (decimal, no leading zeros,
// 2 <= n <= Max, i < n) is shard i of n. It lets outboxd find the slots of
// another shard count when resharding.
func Parse(base, name string) (i, n int, ok bool) {
	if name == base {
		return 0, 1, true
	}
	b, i, n, ok := split(name)
	if !ok || b != base || n < 2 {
		return 0, 0, false
	}
	return i, n, true
}

// split splits name into base, i and n if it ends in _<i>of<n> with
// 1 <= n <= Max and 0 <= i < n.
func split(name string) (base string, i, n int, ok bool) {
	u := strings.LastIndexByte(name, '_')
	if u < 0 {
		return "", 0, 0, false
	}
	is, ns, found := strings.Cut(name[u+1:], "of")
	if !found {
		return "", 0, 0, false
	}
	i, iok := decimal(is)
	n, nok := decimal(ns)
	if !iok || !nok || n < 1 || n > Max || i >= n {
		return "", 0, 0, false
	}
	return name[:u], i, n, true
}

// decimal parses a non-negative decimal without sign or leading zeros.
func decimal(s string) (int, bool) {
	if s == "" || len(s) > 3 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	v := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, true
}
