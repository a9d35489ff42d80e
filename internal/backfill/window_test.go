package backfill

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// pageOf is a page of n rows keyed first, first+1, ….
func pageOf(first, n int) []row {
	page := make([]row, n)
	for i := range page {
		page[i].key = []string{fmt.Sprint(first + i)}
	}
	return page
}

// The window settles a page only when it and every page before it were
// acknowledged whole: never past a row not acknowledged, whatever order the
// answers come in, and never past a failed record or a page cut short.
func TestWindowSettles(t *testing.T) {
	refused := errors.New("refused")
	tests := []struct {
		name string
		// pages: rows per page; handed: rows handed of each (the rest cut);
		// answers: page index and outcome, in the order Kafka gives them,
		// each answering the page's next record.
		pages, handed []int
		answers       []answer
		wantN         int
		wantLast      []string
		wantErr       bool
	}{
		{name: "in order", pages: []int{2, 2}, handed: []int{2, 2},
			answers: []answer{{0, nil}, {0, nil}, {1, nil}, {1, nil}}, wantN: 4, wantLast: []string{"3"}},
		{name: "later pages first", pages: []int{2, 2, 2}, handed: []int{2, 2, 2},
			answers: []answer{{2, nil}, {2, nil}, {1, nil}, {1, nil}, {0, nil}}, wantN: 0},
		{name: "later pages first, then the first", pages: []int{2, 2, 2}, handed: []int{2, 2, 2},
			answers: []answer{{2, nil}, {2, nil}, {1, nil}, {1, nil}, {0, nil}, {0, nil}}, wantN: 6, wantLast: []string{"5"}},
		{name: "a failed record stops it, pages after it acknowledged", pages: []int{2, 2, 2}, handed: []int{2, 2, 2},
			answers: []answer{{0, nil}, {0, nil}, {1, refused}, {1, nil}, {2, nil}, {2, nil}}, wantN: 2, wantLast: []string{"1"}, wantErr: true},
		{name: "a failed first record", pages: []int{2, 2}, handed: []int{2, 2},
			answers: []answer{{1, nil}, {1, nil}, {0, nil}, {0, refused}}, wantN: 0, wantErr: true},
		{name: "a page cut short ends it", pages: []int{3, 2}, handed: []int{2, 2},
			answers: []answer{{0, nil}, {0, nil}, {1, nil}, {1, nil}}, wantN: 2, wantLast: []string{"1"}},
		{name: "a page not answered whole", pages: []int{2, 2}, handed: []int{2, 2},
			answers: []answer{{0, nil}, {1, nil}, {1, nil}}, wantN: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWindow(1<<30, 1<<30, 1)
			var fs []*flight
			first := 0
			for i, n := range tt.pages {
				f := w.open(pageOf(first, n))
				for range tt.handed[i] {
					w.handing(f)
				}
				w.close(f, tt.handed[i])
				fs = append(fs, f)
				first += n
			}
			var n int
			var last []string
			for _, a := range tt.answers {
				fs[a.page].answer(a.err)
				// The sender settles after any answer.
				if dn, dl := w.settled(); dn > 0 {
					n, last = n+dn, dl
				}
			}
			if n != tt.wantN || !slices.Equal(last, tt.wantLast) {
				t.Errorf("settled %d rows up to %v, want %d up to %v", n, last, tt.wantN, tt.wantLast)
			}
			if (w.err() != nil) != tt.wantErr {
				t.Errorf("err = %v, want an error: %v", w.err(), tt.wantErr)
			}
		})
	}
}

type answer struct {
	page int
	err  error
}

// The window is full when another page would take it past its rows, or at
// its bytes; never empty.
func TestWindowBounds(t *testing.T) {
	w := newWindow(4, 1<<30, 2)
	w.open(pageOf(0, 2))
	if w.full() {
		t.Error("full with one page of 2 rows of 4")
	}
	w.open(pageOf(2, 1)) // a short page
	if !w.full() {
		t.Error("not full at 3 rows of 4 with pages of 2")
	}
	if w := newWindow(1, 1, 5); w.full() {
		t.Error("an empty window with pages larger than its bounds is full: nothing could be sent")
	}
	w = newWindow(10, 3, 1)
	w.open(pageOf(0, 2)) // keys "0", "1": 2 bytes
	if w.full() {
		t.Error("full at 2 bytes of 3")
	}
	w.open(pageOf(2, 1))
	if !w.full() {
		t.Error("not full at 3 bytes of 3")
	}
}
