package wal

import (
	"bytes"
	"runtime"
	"testing"
)

// TestKeepCopiesStayPut requires every copy keep returns to hold its
// message after later copies and after an append by its holder, and
// small messages to share slabs.
func TestKeepCopiesStayPut(t *testing.T) {
	var s Stream
	src := make([]byte, slabSize)
	var msgs, kept [][]byte
	for i, n := range []int{1, 300, 0, smallMessage, smallMessage + 1, 250, slabSize, 4000, 4000, 4000, 4000, 4000, 4000, 4000, 4000, 17} {
		for j := range n {
			src[j] = byte(i*31 + j)
		}
		msgs = append(msgs, bytes.Clone(src[:n]))
		k := s.keep(src[:n]) // src is reused, as the connection reuses its buffer
		if cap(k) != len(k) {
			t.Fatalf("copy %d: capacity %d beyond its length %d lets an append write over the next", i, cap(k), len(k))
		}
		kept = append(kept, k)
		_ = append(kept[0], 0xFF) // an append by a holder must not reach another copy
	}
	for i := range msgs {
		if !bytes.Equal(kept[i], msgs[i]) {
			t.Errorf("copy %d (%d B) no longer holds its message", i, len(msgs[i]))
		}
	}
	// testing.AllocsPerRun rounds down to whole allocations per call, so
	// count them over many calls.
	const calls = 10000
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range calls {
		s.keep(src[:250])
	}
	runtime.ReadMemStats(&after)
	if allocs := float64(after.Mallocs-before.Mallocs) / calls; allocs > 0.1 {
		t.Errorf("keep allocates %.2f times per 250 B message, want one slab per twenty or so", allocs)
	}
	// A big message is copied alone, so that a slab never holds on to it.
	n := len(s.slab)
	if big := s.keep(src[:smallMessage+1]); len(s.slab) != n || cap(big) != len(big) {
		t.Error("a big message was copied into a slab")
	}
}
