package dlq

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// WriteTable writes letters as a table for people: one line each, the
// reason cut short (WriteJSON has it whole). status adds a STATUS column.
func WriteTable(w io.Writer, letters []*Letter, now time.Time, status bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "PARTITION/OFFSET\tEVENT ID\tAGE\tINTENDED TOPIC\tSOURCE LSN\t"
	if status {
		head += "STATUS\t"
	}
	fmt.Fprintln(tw, head+"REASON")
	for _, l := range letters {
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t", l.Ref(), printable(l.EventID, 40), age(now, l.Time),
			printable(l.Topic, 40), printable(l.SourceLSN, 20))
		if status {
			line += string(l.Status) + "\t"
		}
		reason := l.Reason
		if l.NotRedrivable != "" && l.Status == Pending {
			reason = "[not redrivable] " + reason
		}
		fmt.Fprintln(tw, line+printable(reason, 100))
	}
	return tw.Flush()
}

// jsonLetter is a letter as WriteJSON writes it.
type jsonLetter struct {
	*Letter
	AgeSeconds float64 `json:"age_seconds"`
	Key        string  `json:"key"`
	IDHeader   string  `json:"id_header"` // the header its event id is in
}

// WriteJSON writes letters as a stream of JSON objects, one a line (as
// "go list -json" does), with the whole reason and the key.
func WriteJSON(w io.Writer, letters []*Letter, now time.Time) error {
	enc := json.NewEncoder(w)
	for _, l := range letters {
		if err := enc.Encode(jsonLetter{Letter: l, AgeSeconds: now.Sub(l.Time).Seconds(), Key: string(l.Key), IDHeader: l.Names.ID}); err != nil {
			return err
		}
	}
	return nil
}
