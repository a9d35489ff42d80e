package dlq

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/config"
)

func hdrs(kv ...string) []kgo.RecordHeader {
	var hs []kgo.RecordHeader
	for i := 0; i < len(kv); i += 2 {
		hs = append(hs, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return hs
}

// defaults are the default router.id_header and router.event_type_header.
var defaults = Names{ID: "id", EventType: "eventType"}

// deadLetter is a record as relay.deadLetter writes it (without the header
// names, as before outboxd recorded them).
func deadLetter(p int32, off int64, id, topic string, extra ...string) *kgo.Record {
	return &kgo.Record{Partition: p, Offset: off, Key: []byte("k-" + id), Value: []byte(`{"id":"` + id + `"}`),
		Timestamp: time.Date(2026, 11, 26, 10, 0, int(off), 0, time.UTC),
		Headers: hdrs(append([]string{"id", id, "eventType", "Placed", "tenantId", "acme",
			HeaderReason, "partition 99 chosen by its partition column does not exist", HeaderSourceLSN, "0/16B3748",
			HeaderSourceTable, "public.outbox", HeaderIntendedTopic, topic}, extra...)...)}
}

// A dead letter is pending until a marker or a rewritten dead letter
// refers to it; those that cannot go back as they are say why.
func TestBuild(t *testing.T) {
	again := deadLetter(0, 3, "b", "orders-events", HeaderSupersedes, "0/1")
	again.Headers = append(again.Headers, kgo.RecordHeader{Key: HeaderReason, Value: []byte("redrive: too large")})
	recs := []*kgo.Record{
		deadLetter(0, 0, "a", "orders-events"),
		deadLetter(0, 1, "b", "orders-events"),
		{Partition: 0, Offset: 2, Headers: hdrs(HeaderRedriven, "0/0", "id", "a")},
		again,
		deadLetter(1, 0, "c", ""),
		deadLetter(1, 1, "d", "bad topic-events"),
		deadLetter(1, 2, "e", "orders-events", HeaderPayloadDropped, "2000000 bytes"),
		deadLetter(1, 3, "f", "orders-events", HeaderHeadersDropped, "9 headers"),
		deadLetter(1, 4, "", "orders-events"),
		deadLetter(1, 5, "g", "orders-events", HeaderUnbuilt, "the key and value are the row's columns"),
	}
	top := Build("dlq", Only(defaults), recs)
	type want struct {
		status Status
		reason string
		why    string // in NotRedrivable
	}
	wants := map[string]want{
		"0/0": {Redriven, "partition 99", ""},
		"0/1": {Superseded, "partition 99", ""},
		"0/3": {Pending, "redrive: too large", ""},
		"1/0": {Pending, "partition 99", "no intended topic"},
		"1/1": {Pending, "partition 99", "not a Kafka topic name"},
		"1/2": {Pending, "partition 99", "lacks the payload"},
		"1/3": {Pending, "partition 99", "lacks the original headers"},
		"1/4": {Pending, "partition 99", `no event id in header "id"`},
		"1/5": {Pending, "partition 99", "routing refused the row"},
	}
	if len(top.Letters) != len(wants) {
		t.Fatalf("%d letters, want %d (markers are not letters)", len(top.Letters), len(wants))
	}
	for _, l := range top.Letters {
		w, ok := wants[l.Ref()]
		if !ok {
			t.Errorf("unexpected letter %s", l.Ref())
			continue
		}
		if l.Status != w.status || !strings.Contains(l.Reason, w.reason) || (w.why == "") != (l.NotRedrivable == "") ||
			!strings.Contains(l.NotRedrivable, w.why) {
			t.Errorf("%s: status %s, reason %q, not redrivable %q; want %s, %q, %q", l.Ref(), l.Status, l.Reason, l.NotRedrivable, w.status, w.reason, w.why)
		}
	}
	if got := top.Select(Filter{}); len(got) != 7 {
		t.Errorf("pending: %d letters, want 7", len(got))
	}
	if got := top.Select(Filter{All: true}); len(got) != 9 {
		t.Errorf("all: %d letters, want 9", len(got))
	}
	if got := top.Select(Filter{IDs: []string{"b", "c"}}); len(got) != 2 || got[0].Ref() != "0/3" || got[1].Ref() != "1/0" {
		t.Errorf("-id b,c selected %v, want 0/3 and 1/0", refs(got))
	}
	if got := top.Select(Filter{Since: time.Date(2026, 11, 26, 10, 0, 3, 0, time.UTC)}); len(got) != 4 {
		t.Errorf("-since selected %v, want 0/3, 1/3, 1/4 and 1/5", refs(got))
	}
}

// A marker or a rewritten dead letter settles a letter only from the
// letter's partition, after it, with its event id: one in another
// partition, before it or of another event (a stale run writing into a
// topic created again, a mirrored copy) leaves it pending.
func TestBuildClaimsMustMatch(t *testing.T) {
	again := func(p int32, off int64, id, ref string) *kgo.Record {
		return deadLetter(p, off, id, "orders-events", HeaderSupersedes, ref)
	}
	for _, tc := range []struct {
		name  string
		claim *kgo.Record
		want  Status
	}{
		{"marker", &kgo.Record{Partition: 0, Offset: 5, Headers: hdrs(HeaderRedriven, "0/3", "id", "a")}, Redriven},
		{"marker in another partition", &kgo.Record{Partition: 1, Offset: 5, Headers: hdrs(HeaderRedriven, "0/3", "id", "a")}, Pending},
		{"marker before the letter", &kgo.Record{Partition: 0, Offset: 2, Headers: hdrs(HeaderRedriven, "0/3", "id", "a")}, Pending},
		{"marker of another event", &kgo.Record{Partition: 0, Offset: 5, Headers: hdrs(HeaderRedriven, "0/3", "id", "zzz")}, Pending},
		{"marker without an id", &kgo.Record{Partition: 0, Offset: 5, Headers: hdrs(HeaderRedriven, "0/3")}, Pending},
		{"rewritten", again(0, 5, "a", "0/3"), Superseded},
		{"rewritten in another partition", again(1, 5, "a", "0/3"), Pending},
		{"rewritten of another event", again(0, 5, "zzz", "0/3"), Pending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			top := Build("dlq", Only(defaults), []*kgo.Record{deadLetter(0, 3, "a", "orders-events"), tc.claim})
			for _, l := range top.Letters {
				if l.Ref() == "0/3" && l.Status != tc.want {
					t.Errorf("letter a at 0/3 is %s, want %s", l.Status, tc.want)
				}
			}
		})
	}
}

// A dead letter records the names of its id and event type headers (they
// may differ per table): list and redrive read its id by that name whatever
// the configuration says, a marker and a dead letter written again record
// them too, and a redriven record goes out without them. A dead letter
// from before outboxd recorded them is read with the configured names, and
// records them once written again.
func TestLetterHeaderNames(t *testing.T) {
	own := Names{ID: "eventId", EventType: "kind"}
	letter := &kgo.Record{Partition: 0, Offset: 0, Key: []byte("k"), Value: []byte("{}"), Headers: hdrs(
		"eventId", "e1", "kind", "Placed", "id", "not-the-id",
		HeaderReason, "too large", HeaderSourceLSN, "0/10", HeaderSourceTable, "b.outbox", HeaderIntendedTopic, "b-events",
		HeaderIDHeader, "eventId", HeaderEventTypeHeader, "kind")}
	l := Build("dlq", Only(defaults), []*kgo.Record{letter}).Letters[0]
	if l.EventID != "e1" || l.EventType != "Placed" || l.Names != own || l.NotRedrivable != "" {
		t.Fatalf("letter: id %q, type %q, names %+v, not redrivable %q; want e1, Placed, %+v, redrivable", l.EventID, l.EventType, l.Names, l.NotRedrivable, own)
	}
	var got []string
	for _, h := range l.record().Headers {
		got = append(got, h.Key+"="+string(h.Value))
	}
	if want := "eventId=e1 kind=Placed id=not-the-id"; strings.Join(got, " ") != want {
		t.Errorf("redriven record's headers %v, want %s (the original's, without outboxd's)", got, want)
	}
	m := l.marker("dlq")
	if v, _ := header(kgoHeaders(m.Headers), "eventId"); v != "e1" {
		t.Errorf("marker headers %v: want the event id under eventId", m.Headers)
	}
	top := Build("dlq", Only(defaults), []*kgo.Record{letter, {Partition: 0, Offset: 1, Headers: kgoHeaders(m.Headers)}})
	if len(top.Letters) != 1 || top.Letters[0].Status != Redriven {
		t.Errorf("letter and its marker: %d letters, status %s; want one, redriven", len(top.Letters), top.Letters[0].Status)
	}

	// Written before the names were recorded: the configured ones.
	old := deadLetter(0, 0, "a", "orders-events")
	l = Build("dlq", Only(defaults), []*kgo.Record{old}).Letters[0]
	if l.EventID != "a" || l.EventType != "Placed" || l.Names != defaults {
		t.Errorf("old letter: id %q, type %q, names %+v; want a, Placed, the configured %+v", l.EventID, l.EventType, l.Names, defaults)
	}
	l = Build("dlq", Only(Names{ID: "eventId"}), []*kgo.Record{old}).Letters[0]
	if l.EventID != "" || !strings.Contains(l.NotRedrivable, `no event id in header "eventId"`) {
		t.Errorf("old letter under another configured id header: id %q, not redrivable %q", l.EventID, l.NotRedrivable)
	}
	// Written again, it records them, and no longer depends on them.
	l = Build("dlq", Only(defaults), []*kgo.Record{old}).Letters[0]
	a := l.again("dlq", "redrive: refused")
	b := Build("dlq", Only(Names{ID: "eventId"}), []*kgo.Record{old, {Partition: 0, Offset: 1, Key: a.Key, Value: a.Value, Headers: kgoHeaders(a.Headers)}})
	if len(b.Letters) != 2 || b.Letters[1].EventID != "a" || b.Letters[1].Names != defaults || b.Letters[1].NotRedrivable != "" {
		t.Fatalf("written again, read under another configured id header: %+v", b.Letters[len(b.Letters)-1])
	}
	if b.Letters[0].Status != Pending {
		t.Errorf("the old letter read under another id header is %s: its event id is unknown, so it stays pending (at worst sent twice, never skipped)", b.Letters[0].Status)
	}
}

// A dead letter that records no header names is read with those of its
// table's entry of postgres.tables: a deployment of one table could set
// id_header in its entry before outboxd recorded the names, and listing a
// second table must not change how its older dead letters read. So is an
// older marker, by the names of the letter it names. Where the name still
// finds no id, the reason says the letter predates the recorded names.
func TestOldLettersTakeTheirTablesNames(t *testing.T) {
	cfg := config.Default()
	cfg.Postgres.Table = ""
	cfg.Router.Messages.Unowned = config.UnownedIgnore
	if err := yaml.Unmarshal([]byte(`[public.outbox, {name: orders.events, router: {id_header: eventId, poison: {policy: dlq, dlq_topic: dlq}}}]`), &cfg.Postgres.Tables); err != nil {
		t.Fatal(err)
	}
	old := func(off int64, table, idHeader string) *kgo.Record {
		return &kgo.Record{Partition: 0, Offset: off, Key: []byte("k"), Value: []byte("{}"), Headers: hdrs(idHeader, "e1", "eventType", "Placed",
			HeaderReason, "too large", HeaderSourceLSN, "0/10", HeaderSourceTable, table, HeaderIntendedTopic, "orders.x")}
	}
	marker := &kgo.Record{Partition: 0, Offset: 1, Headers: hdrs(HeaderRedriven, "0/0", "eventId", "e1", HeaderIntendedTopic, "orders.x")}

	top := Build("dlq", FallbackOf(cfg), []*kgo.Record{old(0, "orders.events", "eventId")})
	if l := top.Letters[0]; l.EventID != "e1" || l.NotRedrivable != "" || l.Names.ID != "eventId" {
		t.Errorf("older letter of orders.events: id %q, names %+v, not redrivable %q; want e1 under its entry's eventId", l.EventID, l.Names, l.NotRedrivable)
	}
	top = Build("dlq", FallbackOf(cfg), []*kgo.Record{old(0, "orders.events", "eventId"), marker})
	if l := top.Letters[0]; l.Status != Redriven {
		t.Errorf("older letter of orders.events and its older marker: %s, want redriven", l.Status)
	}
	// Another table, or none (a message): the top-level names.
	if l := Build("dlq", FallbackOf(cfg), []*kgo.Record{old(0, "public.outbox", "id")}).Letters[0]; l.EventID != "e1" {
		t.Errorf("older letter of public.outbox: id %q (%s), want e1 under the top-level id", l.EventID, l.NotRedrivable)
	}
	l := Build("dlq", FallbackOf(cfg), []*kgo.Record{old(0, "message outbox", "eventId")}).Letters[0]
	for _, want := range []string{`no event id in header "id"`, "written before outboxd recorded its header names", "the top-level router", "message outbox"} {
		if !strings.Contains(l.NotRedrivable, want) {
			t.Errorf("older letter under a name its table does not use: not redrivable %q, want it to say %q", l.NotRedrivable, want)
		}
	}
}

func refs(ls []*Letter) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Ref())
	}
	return out
}

// A redriven record is the original: key, value and headers, without the
// dead-letter topic's own; the marker and the rewritten dead letter go to
// the dead letter's partition.
func TestRecords(t *testing.T) {
	l := Build("dlq", Only(defaults), []*kgo.Record{deadLetter(2, 7, "a", "orders-events", HeaderSupersedes, "2/1")}).Letters[0]
	rec := l.record()
	var got []string
	for _, h := range rec.Headers {
		got = append(got, h.Key+"="+string(h.Value))
	}
	if strings.Join(got, " ") != "id=a eventType=Placed tenantId=acme" || rec.Topic != "orders-events" || rec.Partition != -1 ||
		string(rec.Key) != "k-a" || string(rec.Value) != `{"id":"a"}` || rec.EventID != "a" {
		t.Errorf("redriven record: topic %s partition %d key %q value %q headers %v", rec.Topic, rec.Partition, rec.Key, rec.Value, got)
	}
	m := l.marker("dlq")
	if m.Topic != "dlq" || m.Partition != 2 || m.Value != nil || m.Headers[0].Key != HeaderRedriven || string(m.Headers[0].Value) != "2/7" {
		t.Errorf("marker: topic %s partition %d value %q headers %v", m.Topic, m.Partition, m.Value, m.Headers)
	}
	a := l.again("dlq", "redrive: refused")
	b := Build("dlq", Only(defaults), []*kgo.Record{{Partition: a.Partition, Offset: 9, Timestamp: time.Now(), Key: a.Key, Value: a.Value, Headers: kgoHeaders(a.Headers)}}).Letters[0]
	if b.Reason != "redrive: refused" || b.Topic != "orders-events" || b.SourceLSN != "0/16B3748" || b.EventID != "a" || a.Partition != 2 {
		t.Errorf("written again: reason %q topic %q lsn %q id %q partition %d", b.Reason, b.Topic, b.SourceLSN, b.EventID, a.Partition)
	}
	if s, _ := header(b.Headers, HeaderSupersedes); s != "2/7" {
		t.Errorf("written again supersedes %q, want 2/7", s)
	}
	// Its age counts from the first dead-lettering, however often it is
	// written again.
	c := Build("dlq", Only(defaults), []*kgo.Record{{Partition: 2, Offset: 12, Timestamp: time.Now(), Headers: kgoHeaders(b.again("dlq", "x").Headers)}}).Letters[0]
	if !b.Time.Equal(l.Time) || !c.Time.Equal(l.Time) {
		t.Errorf("written again at %v and %v, first dead-lettered at %v: want the first time", b.Time, c.Time, l.Time)
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
		err  string
	}{
		{"", time.Time{}, ""},
		{"90m", now.Add(-90 * time.Minute), ""},
		{"2026-11-26T10:00:00Z", time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC), ""},
		{"2026-11-25", time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC), ""},
		{"-1h", time.Time{}, "positive duration"},
		{"yesterday", time.Time{}, "neither a duration"},
	} {
		got, err := ParseSince(tc.in, now)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseSince(%q) = %v, want an error with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("ParseSince(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	if got := ParseIDs([]string{"a, b", "c", ""}); strings.Join(got, "|") != "a|b|c" {
		t.Errorf("ParseIDs = %q", got)
	}
}

func TestWrite(t *testing.T) {
	top := Build("dlq", Only(defaults), []*kgo.Record{deadLetter(0, 0, "a", "orders-events"), deadLetter(0, 1, "b", "")})
	now := time.Date(2026, 11, 26, 12, 30, 0, 0, time.UTC)
	var buf bytes.Buffer
	if err := WriteTable(&buf, top.Letters, now, false); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "PARTITION/OFFSET") ||
		!strings.Contains(lines[1], "0/0") || !strings.Contains(lines[1], "2h30m") || !strings.Contains(lines[1], "orders-events") ||
		!strings.Contains(lines[1], "0/16B3748") || !strings.Contains(lines[2], "[not redrivable]") {
		t.Errorf("table:\n%s", buf.String())
	}
	buf.Reset()
	if err := WriteJSON(&buf, top.Letters, now); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(&buf)
	var first map[string]any
	if err := dec.Decode(&first); err != nil {
		t.Fatal(err)
	}
	if first["event_id"] != "a" || first["intended_topic"] != "orders-events" || first["source_lsn"] != "0/16B3748" ||
		first["age_seconds"] != 9000.0 || first["status"] != "pending" || first["key"] != "k-a" ||
		first["id_header"] != "id" || first["event_type"] != "Placed" {
		t.Errorf("JSON: %v", first)
	}
}
