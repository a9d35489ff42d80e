package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The delivery check: every contender's records are read back after its
// run, as a read_committed consumer reads them, and each event is found by
// what identifies it. A catch-up fill numbers its events (the payload's
// "seq", 0 to n-1); a live writer gives each event a uuid, which the
// contenders carry in an "id" header. An event never found is missing; a
// record of an event already found is a repeat.

// seqOf returns the fill's sequence number in a record's value: the payload
// itself ({"seq": 12, ...} as Postgres prints jsonb, {"data":…,"seq":12} as
// Go marshals it) or any envelope that carries it, as an object or as a
// JSON string (…\"seq\": 12…).
func seqOf(value []byte) (int, bool) {
	i := bytes.Index(value, []byte(`seq`))
	if i < 0 {
		return 0, false
	}
	j := i + len("seq")
	for j < len(value) && bytes.IndexByte([]byte(`\": `), value[j]) >= 0 {
		j++
	}
	n, digits := 0, 0
	for ; j < len(value) && value[j] >= '0' && value[j] <= '9'; j++ {
		n = n*10 + int(value[j]-'0')
		digits++
	}
	return n, digits > 0
}

// idOf returns a live event's uuid: its "id" header, or, for a contender
// that writes no headers, the first "id":"<uuid>" in its value.
func idOf(r *kgo.Record) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == "id" {
			return string(h.Value), true
		}
	}
	i := bytes.Index(r.Value, []byte(`"id":"`))
	if i < 0 || len(r.Value) < i+6+36 {
		return "", false
	}
	id := r.Value[i+6 : i+6+36]
	if id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' {
		return "", false
	}
	return string(id), true
}

// tally counts the fill's events found in Kafka.
type tally struct {
	seen       []uint16 // by seq
	unreadable int      // records with no seq
}

func newTally(n int) *tally { return &tally{seen: make([]uint16, n)} }

func (t *tally) add(value []byte) {
	seq, ok := seqOf(value)
	if !ok || seq >= len(t.seen) {
		t.unreadable++
		return
	}
	if t.seen[seq] < 0xffff {
		t.seen[seq]++
	}
}

// counts returns the events never found and the records beyond one per
// event (a record whose seq could not be read counts as a repeat: it is not
// one of the n events).
func (t *tally) counts() (missing, repeated int) {
	for _, c := range t.seen {
		switch {
		case c == 0:
			missing++
		case c > 1:
			repeated += int(c) - 1
		}
	}
	return missing, repeated + t.unreadable
}

// verifyCatchup reads the records between base and end of the run's topics
// as a read_committed consumer and counts the fill's n events in them.
func verifyCatchup(ctx context.Context, brokers string, base, end offsets, n int) (missing, repeated int, err error) {
	cr, err := newCommittedReader(brokers, base)
	if err != nil {
		return 0, 0, err
	}
	defer cr.close()
	cr.tally = newTally(n)
	if err := cr.until(ctx, func() bool { return cr.reached(end) }, func() error { return nil }, 2*time.Minute); err != nil {
		return 0, 0, fmt.Errorf("reading the run's records back: %w", err)
	}
	missing, repeated = cr.tally.counts()
	return missing, repeated, nil
}

// deliveryNote describes a verified run's delivery for its note.
func deliveryNote(missing, repeated int) string {
	if missing == 0 && repeated == 0 {
		return "every event once"
	}
	return fmt.Sprintf("%d events missing, %d repeated records", missing, repeated)
}

// cmdUnavailable prints the result line of a contender that could not be
// set up on this machine, with the reason in one line, so that the report
// names it beside the targets it would have been judged against.
func cmdUnavailable(args []string) error {
	var c common
	fs := flag.NewFlagSet("unavailable", flag.ExitOnError)
	c.register(fs)
	reason := fs.String("reason", "", "why, in one line")
	_ = fs.Parse(args)
	if c.label == "" || strings.TrimSpace(*reason) == "" {
		return errors.New("-label and -reason are required")
	}
	r := newResult(c, "unavailable")
	r.Note = strings.Join(strings.Fields(*reason), " ")
	r.print()
	return nil
}
