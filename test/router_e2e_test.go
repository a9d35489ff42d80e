package test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// insertEvent writes one outbox row in its own transaction and returns its
// id and the transaction's commit LSN.
func insertEvent(t *testing.T, d *db, aggType, aggID, payload string) (id string, lsn uint64) {
	t.Helper()
	id = uuid()
	ctx := context.Background()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, insertSQL, id, aggType, aggID, "Happened", payload); err != nil {
		t.Fatal(err)
	}
	var s string
	if err := tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return id, parseLSN(t, s)
}

func ids(recs []*kgo.Record) map[string]*kgo.Record {
	out := map[string]*kgo.Record{}
	for _, r := range recs {
		out[header(r, "id")] = r
	}
	return out
}

func waitIDs(want ...string) func([]*kgo.Record) bool {
	return func(recs []*kgo.Record) bool {
		got := ids(recs)
		for _, id := range want {
			if got[id] == nil {
				return false
			}
		}
		return true
	}
}

// A poison row halts outboxd by default: it exits 1 naming the event id and
// LSN, and the slot is not confirmed past the row. Switching the policy to
// dlq moves past it deliberately: the row goes to the dead-letter topic with
// its reason and origin, and nothing after it is lost.
func TestPoisonRowHaltsThenDeadLetters(t *testing.T) {
	d := newDB(t)
	agg := d.name + "_ok"
	p := start(t, d.env())
	p.waitStreaming()

	before, _ := insertEvent(t, d, agg, "a-1", `{"n": 1}`)
	readUntil(t, []string{agg + "-events"}, time.Minute, 0, waitIDs(before))
	poison, poisonLSN := insertEvent(t, d, "bad topic", "a-1", `{"n": 2}`)
	after, _ := insertEvent(t, d, agg, "a-1", `{"n": 3}`)

	if code := p.waitExit(60 * time.Second); code != 1 {
		t.Fatalf("outboxd exited %d on a poison row, want 1", code)
	}
	logs := p.logs.String()
	for _, want := range []string{poison, "cannot route outbox row", `topic \"bad topic-events\"`, "router.poison.policy: dlq"} {
		if !strings.Contains(logs, want) {
			t.Errorf("halt message does not contain %q:\n%s", want, logs)
		}
	}
	if !regexp.MustCompile(`at LSN [0-9A-F]+/[0-9A-F]+`).MatchString(logs) {
		t.Errorf("halt message names no LSN:\n%s", logs)
	}
	if c := d.confirmedFlush(t); c > poisonLSN {
		t.Fatalf("slot confirmed %X, past the halted row at %X", c, poisonLSN)
	}

	dlq := d.name + "_dlq"
	p = start(t, d.env("OUTBOXD_ROUTER_POISON_POLICY=dlq", "OUTBOXD_ROUTER_POISON_DLQ_TOPIC="+dlq))
	p.waitStreaming()
	recs := readUntil(t, []string{agg + "-events", dlq}, time.Minute, time.Second, waitIDs(before, poison, after))
	got := ids(recs)
	dead := got[poison]
	if dead.Topic != dlq {
		t.Fatalf("poison row went to %s, want the dead-letter topic %s", dead.Topic, dlq)
	}
	for h, want := range map[string]string{
		"outboxd.source.table": "public.outbox", "outboxd.intended.topic": "bad topic-events", "eventType": "Happened",
	} {
		if header(dead, h) != want {
			t.Errorf("dead letter header %s = %q, want %q", h, header(dead, h), want)
		}
	}
	if !strings.Contains(header(dead, "outboxd.error.reason"), "not allowed in a Kafka topic name") {
		t.Errorf("dead letter reason = %q", header(dead, "outboxd.error.reason"))
	}
	if parseLSN(t, header(dead, "outboxd.source.lsn")) == 0 || string(dead.Value) != `{"n": 2}` || string(dead.Key) != "a-1" {
		t.Errorf("dead letter lsn=%q key=%q value=%q", header(dead, "outboxd.source.lsn"), dead.Key, dead.Value)
	}
	if got[after] == nil || got[after].Topic != agg+"-events" {
		t.Errorf("the row after the poison row was not delivered to %s", agg+"-events")
	}
	if v, ok := p.metricLabelled(`outboxd_router_dead_lettered_total{table="public.outbox"}`); !ok || v != 1 {
		t.Errorf("outboxd_router_dead_lettered_total = %v (found %v), want 1", v, ok)
	}
}

// Oversized rows and rows whose partition column names no partition are
// poison rows too; with dlq they are dead-lettered and the stream goes on.
func TestOversizedAndBadPartitionRowsAreDeadLettered(t *testing.T) {
	d := newDB(t)
	d.exec(t, `ALTER TABLE outbox ADD COLUMN shard int, ADD COLUMN tenant text`)
	agg, dlq := d.name+"_ev", d.name+"_dlq"
	p := start(t, d.env("OUTBOXD_ROUTER_POISON_POLICY=dlq", "OUTBOXD_ROUTER_POISON_DLQ_TOPIC="+dlq,
		"OUTBOXD_ROUTER_ADDITIONAL_FIELDS=shard:partition,tenant:header:tenantId", "OUTBOXD_KAFKA_MAX_MESSAGE_BYTES=100000"))
	p.waitStreaming()
	big := uuid()
	d.exec(t, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, tenant) VALUES ($1, $2, 'k', 'Happened', $3, 'acme')`,
		big, agg, fmt.Sprintf(`{"blob": "%s"}`, strings.Repeat("x", 200000)))
	ok, _ := insertEvent(t, d, agg, "k", `{"small": true}`)
	badShard := uuid()
	d.exec(t, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, shard) VALUES ($1, $2, 'k', 'X', '{}', 99)`, badShard, agg)
	goodShard := uuid()
	d.exec(t, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, shard) VALUES ($1, $2, 'k', 'X', '{}', 5)`, goodShard, agg)

	recs := readUntil(t, []string{agg + "-events", dlq}, time.Minute, time.Second, waitIDs(big, ok, badShard, goodShard))
	got := ids(recs)
	if r := got[big]; r.Topic != dlq || r.Value != nil || !strings.Contains(header(r, "outboxd.error.reason"), "over kafka.max_message_bytes") {
		t.Errorf("oversized row: topic %s, %d value bytes, reason %q; want the DLQ without its value", r.Topic, len(r.Value), header(r, "outboxd.error.reason"))
	}
	// The dead letter keeps every header of the original and says what it
	// dropped and why.
	if r := got[big]; header(r, "tenantId") != "acme" || header(r, "eventType") != "Happened" ||
		!strings.Contains(header(r, "outboxd.payload.dropped"), "bytes: a dead letter keeps the payload only within half of kafka.max_message_bytes (50000)") {
		t.Errorf("oversized row's dead letter: tenantId %q, eventType %q, outboxd.payload.dropped %q; want the original's headers and what was dropped",
			header(r, "tenantId"), header(r, "eventType"), header(r, "outboxd.payload.dropped"))
	}
	if r := got[badShard]; r.Topic != dlq || !strings.Contains(header(r, "outboxd.error.reason"), "partition 99") {
		t.Errorf("bad partition row: topic %s, reason %q", r.Topic, header(r, "outboxd.error.reason"))
	}
	if r := got[goodShard]; r.Topic != agg+"-events" || r.Partition != 5 {
		t.Errorf("shard 5 row: topic %s partition %d, want %s partition 5", r.Topic, r.Partition, agg+"-events")
	}
	if got[ok].Topic != agg+"-events" {
		t.Errorf("small row went to %s", got[ok].Topic)
	}
}

// Events written with pg_logical_emit_message, without a table, follow the
// same routing and ack rule; rolled-back and non-transactional messages are
// not delivered, and the first non-transactional one is pointed out. The
// prefix is outboxd's default, the one package outbox writes. A headers
// field (router.headers_column) becomes record headers, null ones without a
// value.
func TestLogicalMessageEvents(t *testing.T) {
	d := newDB(t)
	agg := d.name + "_msg"
	// The column settings describe the table too.
	d.exec(t, `ALTER TABLE outbox ADD COLUMN traceparent text, ADD COLUMN headers jsonb`)
	p := start(t, d.env("OUTBOXD_ROUTER_TRACEPARENT_COLUMN=traceparent", "OUTBOXD_ROUTER_HEADERS_COLUMN=headers"))
	p.waitStreaming()
	msg := func(id string) string {
		return fmt.Sprintf(`{"id": "%s", "aggregate_type": "%s", "aggregate_id": "m-1", "event_type": "Sent", "payload": {"id": "%s"}, "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "headers": {"tenant": "acme", "none": null}}`, id, agg, id)
	}
	ctx := context.Background()
	emit := func(transactional bool, prefix, content string) {
		d.exec(t, `SELECT pg_logical_emit_message($1, $2, $3)`, transactional, prefix, content)
	}
	emit(true, "outbox", msg("m-a"))
	emit(false, "outbox", msg("m-nontx"))
	emit(true, "other", msg("m-other-prefix"))
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outbox', $1)`, msg("m-rolled-back")); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	tx, err = d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"m-b", "m-c"} {
		if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outbox', $1)`, msg(id)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	recs := readUntil(t, []string{agg + "-events"}, time.Minute, 2*time.Second, waitIDs("m-a", "m-b", "m-c"))
	var order []string
	for _, r := range recs {
		order = append(order, header(r, "id"))
		if r.Topic != agg+"-events" || string(r.Key) != "m-1" || header(r, "eventType") != "Sent" ||
			header(r, "traceparent") == "" || string(r.Value) != fmt.Sprintf(`{"id": "%s"}`, header(r, "id")) {
			t.Errorf("message record %s: topic %s key %q headers %v value %q", header(r, "id"), r.Topic, r.Key, r.Headers, r.Value)
		}
		if !hasNullHeader(r, "none") || header(r, "tenant") != "acme" {
			t.Errorf("message record %s: headers %q, want tenant=acme and none without a value", header(r, "id"), r.Headers)
		}
	}
	if strings.Join(order, ",") != "m-a,m-b,m-c" {
		t.Errorf("delivered %v, want exactly m-a, m-b, m-c in commit order", order)
	}
	p.waitLog(`msg="a non-transactional logical message with the outbox prefix is not delivered`, 10*time.Second)

	// The same headers from a row's jsonb column.
	id := uuid()
	d.exec(t, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers) VALUES ($1, $2, 'r-1', 'Sent', '{}', '{"tenant": "acme", "none": null, "n": 2}')`, id, agg)
	for _, r := range readUntil(t, []string{agg + "-events"}, time.Minute, 0, waitIDs(id)) {
		if header(r, "id") == id && (!hasNullHeader(r, "none") || header(r, "tenant") != "acme" || header(r, "n") != "2") {
			t.Errorf("row record: headers %q, want tenant=acme, n=2 and none without a value", r.Headers)
		}
	}
}

// hasNullHeader reports whether rec has header key without a value (as
// opposed to an empty one).
func hasNullHeader(rec *kgo.Record, key string) bool {
	for _, h := range rec.Headers {
		if h.Key == key {
			return h.Value == nil
		}
	}
	return false
}

// router.on_update: error stops outboxd at an UPDATE of an outbox row,
// without confirming past it.
func TestUpdateStopsWithOnUpdateError(t *testing.T) {
	d := newDB(t)
	p := start(t, d.env("OUTBOXD_ROUTER_ON_UPDATE=error"))
	p.waitStreaming()
	id, _ := insertEvent(t, d, d.name+"_upd", "k", `{}`)
	readUntil(t, []string{d.name + "_upd-events"}, time.Minute, 0, waitIDs(id))
	var s string
	if err := d.pool.QueryRow(context.Background(), `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	beforeUpdate := parseLSN(t, s)
	d.exec(t, `UPDATE outbox SET payload = '{"n": 2}' WHERE id = $1`, id)
	if code := p.waitExit(60 * time.Second); code != 1 {
		t.Fatalf("outboxd exited %d after an UPDATE with router.on_update error, want 1", code)
	}
	if !strings.Contains(p.logs.String(), "router.on_update is error") {
		t.Errorf("no error naming router.on_update:\n%s", p.logs.String())
	}
	if got := d.confirmedFlush(t); got > beforeUpdate {
		t.Errorf("slot confirmed at %X, past the UPDATE's transaction (begun after %X)", got, beforeUpdate)
	}
}
