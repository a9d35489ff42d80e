package wal

import (
	"bytes"
	"testing"
)

// TestKeepCopiesStayPut requires every copy keep returns to hold its
// message after later copies and after an append by its holder, and
// small messages to share slabs.
func TestKeepCopiesStayPut(t *testing.T) {
	var s Stream
	src := make([]byte, slabSize)
	var msgs, kept [][]byte
	for i, n := range []int{1, 300, 0, slabSize / 8, slabSize/8 + 1, 250, slabSize, 4000, 4000, 4000, 4000, 4000, 4000, 4000, 4000, 17} {
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
	if allocs := testing.AllocsPerRun(1000, func() { s.keep(src[:250]) }); allocs > 0.05 {
		t.Errorf("keep allocates %.2f times per 250 B message, want one slab per hundred or so", allocs)
	}
}
