package dlq

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
)

// The headers the relay writes on a dead letter (delivery.DeadLetter).
const (
	HeaderReason         = "outboxd.error.reason"
	HeaderSourceLSN      = "outboxd.source.lsn"
	HeaderSourceTable    = "outboxd.source.table"
	HeaderIntendedTopic  = "outboxd.intended.topic"
	HeaderPayloadDropped = "outboxd.payload.dropped"
	HeaderHeadersDropped = "outboxd.headers.dropped"
	// HeaderUnbuilt is on the dead letter of a row that routing refused:
	// no record was built, the key and value are the row's key and payload
	// columns, and only the id and event type headers are kept.
	HeaderUnbuilt = "outboxd.record.unbuilt"
	// HeaderIDHeader and HeaderEventTypeHeader hold the names of the
	// headers that carry this dead letter's event id and event type: the
	// router.id_header and router.event_type_header of its table when it
	// was written (they may differ per table). A dead letter written before
	// outboxd recorded them lacks them: list and redrive then read the
	// configured names of its table (Fallback).
	HeaderIDHeader        = "outboxd.dlq.id.header"
	HeaderEventTypeHeader = "outboxd.dlq.event.type.header"
)

// The headers redrive writes.
const (
	// HeaderRedriven marks a marker record: the dead letter at
	// "PARTITION/OFFSET" is in its intended topic.
	HeaderRedriven = "outboxd.dlq.redriven"
	// HeaderSupersedes is on a dead letter written again with a new
	// reason: it replaces the one at "PARTITION/OFFSET".
	HeaderSupersedes = "outboxd.dlq.supersedes"
	// HeaderFirstTime is on a dead letter written again: when the event
	// was first dead-lettered (RFC 3339), which its age and -since go by.
	// The record's own timestamp is the time it was written again, so that
	// time-based retention counts from then.
	HeaderFirstTime = "outboxd.dlq.first.time"
)

// ownHeaders are the dead-letter topic's own headers: a redriven record
// goes out without them.
var ownHeaders = []string{HeaderReason, HeaderSourceLSN, HeaderSourceTable, HeaderIntendedTopic,
	HeaderPayloadDropped, HeaderHeadersDropped, HeaderUnbuilt, HeaderIDHeader, HeaderEventTypeHeader,
	HeaderRedriven, HeaderSupersedes, HeaderFirstTime}

// Names are the names of the headers that carry the event id and the event
// type.
type Names struct{ ID, EventType string }

// NamesOf returns r's router.id_header and router.event_type_header.
func NamesOf(r config.Router) Names { return Names{ID: r.IDHeader, EventType: r.EventTypeHeader} }

// Fallback returns the names a dead letter of table (its HeaderSourceTable)
// that does not record its own was most likely written with, and the
// settings they come from, for messages.
type Fallback func(table string) (n Names, from string)

// FallbackOf returns the Fallback of cfg: the header names of the entry of
// postgres.tables that the table takes its router settings from
// (config.Postgres.EntryOf), else the top-level router's. A deployment of
// one table could set them in its entry before outboxd recorded them, so
// the top-level ones alone would misread its dead letters once a second
// table is listed.
func FallbackOf(cfg config.Config) Fallback {
	return func(table string) (Names, string) {
		if schema, name, ok := strings.Cut(table, "."); ok {
			if i, ok := cfg.Postgres.EntryOf(schema, name); ok {
				if r, err := cfg.TableRouter(i); err == nil {
					return NamesOf(r), fmt.Sprintf("postgres.tables[%d] (%s)", i, cfg.Postgres.Tables[i].Name)
				}
			}
		}
		return NamesOf(cfg.Router), "the top-level router"
	}
}

// Only returns the Fallback that gives n for every table.
func Only(n Names) Fallback {
	return func(string) (Names, string) { return n, "the top-level router" }
}

// of returns the names a record of the dead-letter topic was written with:
// those it records (HeaderIDHeader, HeaderEventTypeHeader), else n;
// recorded is false when it records no id header name.
func (n Names) of(hs []kgo.RecordHeader) (_ Names, recorded bool) {
	if v, ok := header(hs, HeaderIDHeader); ok && v != "" {
		n.ID, recorded = v, true
	}
	if v, ok := header(hs, HeaderEventTypeHeader); ok {
		n.EventType = v
	}
	return n, recorded
}

// headers returns n as the headers that record it.
func (n Names) headers() []router.Header {
	return []router.Header{{Key: HeaderIDHeader, Value: []byte(n.ID)}, {Key: HeaderEventTypeHeader, Value: []byte(n.EventType)}}
}

// Status is where a dead letter stands.
type Status string

const (
	Pending    Status = "pending"    // not redriven yet
	Redriven   Status = "redriven"   // in its intended topic
	Superseded Status = "superseded" // failed again: a later dead letter has the new reason
)

// Letter is one dead letter.
type Letter struct {
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Time      time.Time `json:"time"` // when the event was first dead-lettered
	EventID   string    `json:"event_id"`
	Reason    string    `json:"reason"`
	SourceLSN string    `json:"source_lsn"`
	Table     string    `json:"source_table"`
	Topic     string    `json:"intended_topic"`
	EventType string    `json:"event_type,omitempty"`
	Status    Status    `json:"status"`
	// Names are the headers its event id and event type are in: those
	// the dead letter records, else the configured ones of its table.
	Names Names `json:"-"`
	// guessed names the settings Names were taken from when the dead
	// letter records none ("" when it does).
	guessed string
	// NotRedrivable says why redrive leaves the letter alone ("" when it
	// can be redriven).
	NotRedrivable string `json:"not_redrivable,omitempty"`

	Key     []byte             `json:"-"`
	Value   []byte             `json:"-"`
	Headers []kgo.RecordHeader `json:"-"`
}

// ref is how markers and rewritten dead letters name a letter.
func ref(partition int32, offset int64) string {
	return fmt.Sprintf("%d/%d", partition, offset)
}

// Ref returns the letter's "PARTITION/OFFSET".
func (l *Letter) Ref() string { return ref(l.Partition, l.Offset) }

func header(hs []kgo.RecordHeader, key string) (string, bool) {
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == key {
			return string(hs[i].Value), true
		}
	}
	return "", false
}

// Topic is the dead letters of a topic read to its end, in offset order
// within each partition.
type Topic struct {
	Name    string
	Letters []*Letter
}

// Build reads the records of a dead-letter topic (markers, dead letters
// and rewritten dead letters, in offset order within each partition) into
// its dead letters and their status. Each record's event id is read from
// the header its HeaderIDHeader names; fallback names the headers of a
// dead letter without it (written before outboxd recorded the names), by
// its table. A marker without it was written with the names its letter was
// read with then: it is read with those of the letter it names.
func Build(name string, fallback Fallback, recs []*kgo.Record) *Topic {
	t := &Topic{Name: name}
	done := map[string][]claim{} // by the ref of the letter they name
	for _, r := range recs {
		if to, ok := header(r.Headers, HeaderRedriven); ok {
			done[to] = append(done[to], claim{Redriven, r.Partition, r.Offset, r.Headers})
			continue
		}
		table, _ := header(r.Headers, HeaderSourceTable)
		guess, from := fallback(table)
		names, recorded := guess.of(r.Headers)
		id, _ := header(r.Headers, names.ID)
		if old, ok := header(r.Headers, HeaderSupersedes); ok {
			done[old] = append(done[old], claim{Superseded, r.Partition, r.Offset, r.Headers})
		}
		l := &Letter{Partition: r.Partition, Offset: r.Offset, Time: r.Timestamp, Key: r.Key, Value: r.Value, Headers: r.Headers}
		if first, ok := header(r.Headers, HeaderFirstTime); ok {
			if ft, err := time.Parse(time.RFC3339Nano, first); err == nil {
				l.Time = ft
			}
		}
		l.Names, l.EventID, l.Table = names, id, table
		if !recorded {
			l.guessed = from
		}
		if names.EventType != "" {
			l.EventType, _ = header(r.Headers, names.EventType)
		}
		l.Reason, _ = header(r.Headers, HeaderReason)
		l.SourceLSN, _ = header(r.Headers, HeaderSourceLSN)
		l.Topic, _ = header(r.Headers, HeaderIntendedTopic)
		l.NotRedrivable = notRedrivable(l)
		t.Letters = append(t.Letters, l)
	}
	for _, l := range t.Letters {
		l.Status = Pending
		for _, c := range done[l.Ref()] {
			if c.of(l) {
				l.Status = c.status
				break
			}
		}
	}
	slices.SortStableFunc(t.Letters, func(a, b *Letter) int {
		if a.Partition != b.Partition {
			return int(a.Partition - b.Partition)
		}
		return int(a.Offset - b.Offset)
	})
	return t
}

// claim is a marker's or a rewritten dead letter's reference to a letter.
type claim struct {
	status    Status
	partition int32
	offset    int64
	headers   []kgo.RecordHeader
}

// of reports whether c settles l: redrive writes markers and rewritten dead
// letters to the letter's partition, after it, with its event id. Anything
// else (a stale run's record in a topic deleted and created again, a copy
// mirrored from another cluster) leaves l pending: at worst it is sent
// twice, never not at all.
func (c claim) of(l *Letter) bool {
	names, _ := l.Names.of(c.headers)
	id, _ := header(c.headers, names.ID)
	return c.partition == l.Partition && c.offset > l.Offset && id == l.EventID
}

// notRedrivable says why l cannot be sent to its intended topic as it is,
// or "".
func notRedrivable(l *Letter) string {
	_, dropped := header(l.Headers, HeaderPayloadDropped)
	_, hdropped := header(l.Headers, HeaderHeadersDropped)
	_, unbuilt := header(l.Headers, HeaderUnbuilt)
	switch {
	case l.Topic == "":
		return "no intended topic: the row could not be routed; fix the row and send it again from the outbox table (outboxd replay)"
	case badTopic(l.Topic):
		return fmt.Sprintf("the intended topic %q is not a Kafka topic name (1-249 letters, digits, '.', '_' or '-'); "+
			"fix the row and send it again from the outbox table (outboxd replay)", l.Topic)
	case unbuilt:
		return "routing refused the row, so the dead letter holds its key and payload columns, not the record outboxd would have sent (" +
			HeaderUnbuilt + "); fix the row or the router configuration and send it again from the outbox table (outboxd replay)"
	case dropped:
		return "the dead letter lacks the payload (" + HeaderPayloadDropped + "); send the event again from the outbox table (outboxd replay)"
	case hdropped:
		return "the dead letter lacks the original headers (" + HeaderHeadersDropped + "); send the event again from the outbox table (outboxd replay)"
	case l.EventID == "" && l.guessed != "":
		return fmt.Sprintf("no event id in header %q: the dead letter was written before outboxd recorded its header names (%s), "+
			"so it was read by router.id_header of %s (its table %s); if it was written under another name, set that name there, "+
			"in the configuration outboxd dlq reads (-config), while you redrive it, else send the event again from the outbox table (outboxd replay)",
			l.Names.ID, HeaderIDHeader, l.guessed, l.Table)
	case l.EventID == "":
		return fmt.Sprintf("no event id in header %q: consumers could not tell a second copy; send the event again from the outbox table (outboxd replay)", l.Names.ID)
	}
	return ""
}

// Filter selects dead letters.
type Filter struct {
	IDs   []string  // event ids; none: every one
	Since time.Time // dead-lettered at or after; zero: any time
	All   bool      // redriven and superseded ones too
}

// Select returns the letters of t that f selects.
func (t *Topic) Select(f Filter) []*Letter {
	var out []*Letter
	for _, l := range t.Letters {
		switch {
		case !f.All && l.Status != Pending:
		case len(f.IDs) > 0 && !slices.Contains(f.IDs, l.EventID):
		case !f.Since.IsZero() && l.Time.Before(f.Since):
		default:
			out = append(out, l)
		}
	}
	return out
}

// record returns the record that redrives l: its original key, value and
// headers without the dead-letter topic's own, to its intended topic,
// partitioned by its key as outboxd partitions (Kafka's murmur2).
func (l *Letter) record() *router.Record {
	rec := &router.Record{Topic: l.Topic, Key: l.Key, Value: l.Value, EventID: l.EventID, Partition: -1}
	for _, h := range l.Headers {
		if !slices.Contains(ownHeaders, h.Key) {
			rec.Headers = append(rec.Headers, router.Header{Key: h.Key, Value: h.Value})
		}
	}
	return rec
}

// marker returns the record that says l was redriven: its event id under
// l's id header, whose name it records. It goes to l's partition:
// retention, which removes a partition's oldest records first, never
// removes a marker before its dead letter.
func (l *Letter) marker(dlq string) *router.Record {
	return &router.Record{Topic: dlq, Key: l.Key, EventID: l.EventID, Partition: l.Partition, Headers: append([]router.Header{
		{Key: HeaderRedriven, Value: []byte(l.Ref())},
		{Key: l.Names.ID, Value: []byte(l.EventID)},
		{Key: HeaderIntendedTopic, Value: []byte(l.Topic)},
	}, l.Names.headers()...)}
}

// again returns l written again with reason, replacing l. It records the
// header names l was read with, so that a dead letter from before outboxd
// recorded them no longer depends on the configuration.
func (l *Letter) again(dlq, reason string) *router.Record {
	rec := &router.Record{Topic: dlq, Key: l.Key, Value: l.Value, EventID: l.EventID, Partition: l.Partition}
	for _, h := range l.Headers {
		if !slices.Contains([]string{HeaderReason, HeaderSupersedes, HeaderFirstTime, HeaderIDHeader, HeaderEventTypeHeader}, h.Key) {
			rec.Headers = append(rec.Headers, router.Header{Key: h.Key, Value: h.Value})
		}
	}
	rec.Headers = append(append(rec.Headers, l.Names.headers()...),
		router.Header{Key: HeaderReason, Value: []byte(reason)},
		router.Header{Key: HeaderSupersedes, Value: []byte(l.Ref())},
		router.Header{Key: HeaderFirstTime, Value: []byte(l.Time.UTC().Format(time.RFC3339Nano))})
	return rec
}

// ParseSince reads -since: a duration back from now ("24h") or a time
// (RFC 3339, or a date).
func ParseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("-since %s: give a positive duration back from now (24h) or a time (2026-11-26T10:00:00Z)", s)
		}
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("-since %q is neither a duration (24h, 90m) nor a time (2026-11-26T10:00:00Z, 2026-11-26)", s)
}

// ParseIDs splits -id values: each may hold several ids separated by
// commas.
func ParseIDs(vals []string) []string {
	var ids []string
	for _, v := range vals {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// age formats how long ago t was, to the two largest units.
func age(now, t time.Time) string {
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// printable returns b as text for a table cell: control characters and
// invalid UTF-8 escaped, cut to n runes.
func printable(s string, n int) string {
	q := strconv.Quote(s)
	q = q[1 : len(q)-1]
	if r := []rune(q); len(r) > n {
		q = string(r[:n-1]) + "…"
	}
	if q == "" {
		return "-"
	}
	return q
}

// badTopic reports whether topic is not a Kafka topic name.
func badTopic(topic string) bool {
	return len(topic) > 249 || topic == "." || topic == ".." ||
		strings.Trim(topic, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != ""
}
