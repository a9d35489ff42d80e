package test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Issue 35 §1 "Settings": two outbox tables with their own id header and
// their own dead-letter topic. A poison row of each (its partition column
// names a partition the topic lacks), written in one transaction, goes to
// its own table's dead-letter topic; "outboxd dlq list" shows each with its
// event id read by the header name the dead letter records (the commands run
// without the daemon's configuration, whose top-level id_header is "id");
// redrive sends each to its intended topic under its table's id header, and
// a second redrive sends nothing. Every event arrives once: 0 lost, 0
// phantom, 0 duplicates.
func TestDLQPerTable(t *testing.T) {
	d := newDB(t)
	orders := severalShapes[1]
	d.exec(t, orders.create)
	d.exec(t, `ALTER TABLE public.outbox ADD COLUMN shard int; ALTER TABLE orders.events ADD COLUMN shard int`)
	publicDLQ, ordersDLQ := d.name+"_dlq", d.name+"_orders_dlq"
	cfg := writeConfig(t, "postgres:\n  tables:\n    - public.outbox\n    - name: "+orders.table+"\n      router: "+
		strings.TrimSuffix(orders.router, "}")+", id_header: eventId, poison: {policy: dlq, dlq_topic: "+ordersDLQ+"}}\n"+
		"router:\n  messages: {unowned: ignore}\n  additional_fields: [{column: shard, placement: partition}]\n"+
		"  poison: {policy: dlq, dlq_topic: "+publicDLQ+"}\n")
	typ := d.name + "_pt"
	publicTopic, ordersTopic := typ+"-events", orders.topic(typ)
	// The event id of a record, under its table's id header.
	idOf := func(r *kgo.Record) string {
		if r.Topic == ordersTopic || r.Topic == ordersDLQ {
			return header(r, "eventId")
		}
		return header(r, "id")
	}
	waitFor := func(ids ...string) func([]*kgo.Record) bool {
		return func(recs []*kgo.Record) bool {
			lost, _, _ := tally(recs, ids, idOf)
			return lost == 0
		}
	}

	p := start(t, d.env(), "-config", cfg)
	p.waitStreaming()
	var all []string
	insert := func(shard string) (publicID, ordersID string) {
		publicID, ordersID = uuid(), uuid()
		d.exec(t, `INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload, shard) VALUES ('`+publicID+`', '`+typ+`', 'k-1', 'Placed', '{}', `+shard+`);
			INSERT INTO orders.events (event_id, stream, stream_no, kind, body, shard) VALUES ('`+ordersID+`', '`+typ+`', 7, 'Placed', '{}', `+shard+`)`)
		all = append(all, publicID, ordersID)
		return publicID, ordersID
	}
	insert("NULL")
	publicPoison, ordersPoison := insert("99")
	insert("NULL")
	readUntil(t, []string{publicTopic, ordersTopic, publicDLQ, ordersDLQ}, time.Minute, 0, waitFor(all...))
	if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("outboxd exited %d on SIGTERM", code)
	}

	env := d.env()
	if out, code := dlqRun(t, env, "list", "-config", cfg); code != 2 || !strings.Contains(out, "several topics ("+publicDLQ+", "+ordersDLQ+"): pass -topic") {
		t.Errorf("dlq list without -topic, two dead-letter topics: exit %d, want 2 and the topics named", code)
	}
	for _, w := range []struct{ dlq, id, idHeader, topic string }{
		{publicDLQ, publicPoison, "id", publicTopic}, {ordersDLQ, ordersPoison, "eventId", ordersTopic},
	} {
		ls := dlqList(t, env, w.dlq)
		if len(ls) != 1 || ls[0].ID != w.id || ls[0].IDHeader != w.idHeader || ls[0].Topic != w.topic || ls[0].NotRedrivable != "" ||
			!strings.Contains(ls[0].Reason, "partition 99") {
			t.Fatalf("dlq list -topic %s: %+v; want the one dead letter %s (in header %s) for %s, redrivable", w.dlq, ls, w.id, w.idHeader, w.topic)
		}
		for _, want := range []string{"redriven: 1, failed again: 0, not redrivable: 0", "redriven: 0, failed again: 0, not redrivable: 0"} {
			if out, code := dlqRun(t, env, "redrive", "-topic", w.dlq); code != 0 || !strings.Contains(out, want) {
				t.Fatalf("dlq redrive -topic %s: exit %d, want 0 and %q", w.dlq, code, want)
			}
		}
		if ls := dlqList(t, env, w.dlq); len(ls) != 0 {
			t.Errorf("pending in %s after the redrives: %+v", w.dlq, ls)
		}
	}

	recs := readUntil(t, []string{publicTopic, ordersTopic}, time.Minute, 2*time.Second, waitFor(all...))
	lost, dups, phantoms := tally(recs, all, idOf)
	t.Logf("%d events of two tables, 2 dead-lettered to their own topics and redriven: %d lost, %d phantom, %d duplicates", len(all), lost, phantoms, dups)
	if lost != 0 || phantoms != 0 || dups != 0 {
		t.Errorf("%d lost, %d phantom, %d duplicates", lost, phantoms, dups)
	}
	partitions := partitionsOf(t, publicTopic, ordersTopic)
	for _, r := range recs {
		if id := idOf(r); id == ordersPoison && (r.Topic != ordersTopic || header(r, "eventId") != id || header(r, "id") != "") ||
			id == publicPoison && (r.Topic != publicTopic || header(r, "id") != id) {
			t.Errorf("redriven %s on %s with headers %v: want it on its table's topic under its table's id header", id, r.Topic, r.Headers)
		}
		for _, h := range r.Headers {
			if strings.HasPrefix(h.Key, "outboxd.") {
				t.Errorf("record %s on %s has header %s", idOf(r), r.Topic, h.Key)
			}
		}
		if want := javaPartition(r.Key, partitions[r.Topic]); r.Partition != want {
			t.Errorf("record %s (key %s) on %s partition %d, murmur2 gives %d", idOf(r), r.Key, r.Topic, r.Partition, want)
		}
	}
}
