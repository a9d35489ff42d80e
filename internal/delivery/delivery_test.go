package delivery

import (
	"testing"

	"github.com/outboxd/outboxd/wal"
)

// A complete transaction waits behind a Commit when a later Commit is in
// its batch.
func TestLastCommit(t *testing.T) {
	b, c := &wal.Begin{}, &wal.Commit{}
	for _, tc := range []struct {
		batch []wal.Item
		want  int
	}{
		{nil, -1},
		{[]wal.Item{b}, -1},
		{[]wal.Item{b, c}, 1},
		{[]wal.Item{b, c, b, c, b}, 3},
	} {
		if got := LastCommit(tc.batch); got != tc.want {
			t.Errorf("LastCommit(%d items) = %d, want %d", len(tc.batch), got, tc.want)
		}
	}
}
