package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/internal/testenv"
)

// The Debezium and Kafka Connect versions the parity test runs, as
// docs/migrating-from-debezium.md names them. Debezium 3.7.0.Final is built
// against Kafka 4.3.1.
const (
	parityDebezium = "3.7.0.Final"
	parityConnect  = "4.3.1"
)

// parityConfig is one connector configuration the parity test runs twice:
// as a real Debezium connector with its EventRouter, and as outboxd with
// the file 'outboxd debezium convert' made of it.
type parityConfig struct {
	name     string
	settings map[string]string // connector settings beyond parityBase's
	env      []string          // extra outboxd environment
}

const (
	stringConv = "org.apache.kafka.connect.storage.StringConverter"
	jsonConv   = "org.apache.kafka.connect.json.JsonConverter"
	bytesConv  = "org.apache.kafka.connect.converters.ByteArrayConverter"
)

var parityConfigs = []parityConfig{
	{name: "json-schema-key", settings: map[string]string{
		"key.converter": jsonConv, "value.converter": stringConv,
		"transforms.outbox.table.field.event.key":             "aggregateid", // nullable: an optional key schema, null keys
		"transforms.outbox.table.fields.additional.placement": "type:header:eventType",
		"transforms.outbox.route.tombstone.on.empty.payload":  "true",
	}},
	{name: "json-key-regex", settings: map[string]string{
		"key.converter": jsonConv, "key.converter.schemas.enable": "false", "value.converter": stringConv,
		"transforms.outbox.route.topic.regex":                 `(?<routedByValue>[a-z]+)_v\d+`,
		"transforms.outbox.table.fields.additional.placement": "type:header:eventType,tenant:header",
	}},
	{name: "string-numeric-key", settings: map[string]string{
		"key.converter": stringConv, "value.converter": stringConv,
		"transforms.outbox.table.field.event.key": "num",
	}},
	{name: "expand", settings: map[string]string{
		"key.converter": stringConv, "value.converter": jsonConv, "value.converter.schemas.enable": "false",
		"transforms.outbox.table.expand.json.payload": "true",
	}},
	{name: "envelope-partition", settings: map[string]string{
		"key.converter": jsonConv, "key.converter.schemas.enable": "false",
		"value.converter": jsonConv, "value.converter.schemas.enable": "false",
		"transforms.outbox.table.fields.additional.placement": "type:envelope:eventType,tenant:envelope,part:partition",
	}},
	{name: "bytea-bigint-key", settings: map[string]string{
		"key.converter": jsonConv, "value.converter": bytesConv,
		"transforms.outbox.table.field.event.key":     "big",
		"transforms.outbox.table.field.event.payload": "bin",
	}},
	{name: "uuid-default-key-context-headers", settings: map[string]string{
		"key.converter": jsonConv, "value.converter": stringConv,
		"transforms.outbox.table.field.event.key": "id", // uuid DEFAULT gen_random_uuid()
		"extended.headers.enabled":                "true",
	}, env: []string{"OUTBOXD_ROUTER_DEBEZIUM_HEADERS_ENABLED=true"}},
	{name: "logical-messages", settings: map[string]string{
		"key.converter": stringConv, "value.converter": stringConv,
		"transforms":                  "decode,outbox",
		"transforms.decode.type":      "io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent",
		"message.prefix.include.list": parityPrefix,
		"transforms.outbox.table.fields.additional.placement": "type:header:eventType",
	}},
}

// parityPrefix is the prefix of the logical decoding messages the parity
// test emits, one transactional and one not.
const parityPrefix = "paritymsg"

// parityMessages are the contents of the messages, by whether they are
// transactional.
var parityMessages = map[bool]string{
	true:  `{"id": "msg-tx", "aggregatetype": "order_v1", "aggregateid": "m-1", "type": "MessageSent", "payload": "hello <&>\u2028"}`,
	false: `{"id": "msg-nontx", "aggregatetype": "order_v1", "aggregateid": "m-1", "type": "MessageSent", "payload": "not in a transaction"}`,
}

// parityRow is one outbox row; nil fields are NULL.
type parityRow struct {
	aggType, typ                                string
	aggID, payload, bin, num, big, part, tenant *string
}

func sp(s string) *string { return &s }

// parityRows exercise keys outside the BMP and non-ASCII, numeric keys
// Java prints in scientific notation, NULL keys and payloads, blank and
// non-JSON payloads, payloads with <&>, control characters and U+2028, and
// JSON that Debezium's expansion rewrites.
var parityRows = [][]parityRow{
	{
		{aggType: "order_v1", typ: "OrderCreated", aggID: sp("k\U0001F642"),
			payload: sp(`{"a": 1.10, "s": "<&>` + "\u2028" + `\u001f\ud83d\ude42", "n": null, "e": [], "t": 1e2}`),
			bin:     sp(`\x00ff10`), num: sp("0.00000010"), big: sp("42"), part: sp("1"), tenant: sp("t<&>")},
		{aggType: "customer_v2", typ: "CustomerUpdated", aggID: sp(`naïve 中文 "q"`),
			payload: sp(`{"items": [{"p": 1}, {"p": 2, "q": "x"}], "big": 10000000000, "d": 0.00000015}`),
			num:     sp("0.00000000"), big: sp("-7"), part: sp("0")},
	},
	{
		{aggType: "order_v1", typ: "OrderCreated", payload: sp("plain <&>\x01 text\u2028"), bin: sp(`\x`), num: sp("-0.00000050"), tenant: sp("t2")},
		{aggType: "order_v1", typ: "OrderPaid", aggID: sp("k\U0001F642"), num: sp("12.5"), big: sp("9223372036854775807"), part: sp("2"), tenant: sp("t")},
		{aggType: "customer_v2", typ: "CustomerUpdated", aggID: sp("c-1"), payload: sp("   "), bin: sp(`\xdeadbeef`), num: sp("1234.56789"), big: sp("1"), tenant: sp("\x1ftab\t")},
	},
	{
		{aggType: "order_v1", typ: "OrderCreated", aggID: sp("o-2"), payload: sp("[]"), num: sp("100")},
		{aggType: "order_v1", typ: "OrderShipped", aggID: sp("k\U0001F642"), payload: sp(`{"dup": 1, "dup": 2, "x": [null, 1]}`)},
		{aggType: "customer_v2", typ: "CustomerUpdated", aggID: sp("c-1"), payload: sp("42"), big: sp("0")},
	},
}

// TestDebeziumParity runs the real Debezium PostgreSQL connector with its
// EventRouter in Kafka Connect and outboxd, each on its own slot over the
// same rows, for each configuration in parityConfigs (outboxd with the file
// 'outboxd debezium convert' makes of the connector's), and compares every
// record: topic, partition, key bytes, value bytes and headers. The record
// timestamp is not compared (see the migration guide). The only differences
// allowed are parityDifferences, which the guide lists.
func TestDebeziumParity(t *testing.T) {
	requireServices(t)
	requireTool(t, "java")
	cache := fetchConnect(t)
	d := newDB(t)
	ctx := context.Background()
	d.exec(t, `CREATE TABLE public.pevents (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
		aggregatetype text NOT NULL, aggregateid text, type text NOT NULL,
		payload text, bin bytea, num numeric(12,8), big bigint, part int, tenant text)`)
	d.exec(t, `CREATE PUBLICATION parity FOR TABLE public.pevents`)

	const partitions = 3
	var topics []string
	for i := range parityConfigs {
		for _, side := range []string{"dbz", "obx"} {
			for _, agg := range []string{"order_v1", "customer_v2", "order", "customer"} {
				topics = append(topics, fmt.Sprintf("%s%d-%s-%s", side, i, d.name, agg))
			}
			slot := fmt.Sprintf("%s_%d_%s", side, i, d.name)
			d.exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
			t.Cleanup(func() {
				_, _ = d.pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, slot)
			})
		}
	}
	createTopics(t, partitions, topics)

	// The rows, committed before either side starts: both read them from
	// their slots.
	var ids []string
	for _, txRows := range parityRows {
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range txRows {
			var id string
			err := tx.QueryRow(ctx, `INSERT INTO pevents (aggregatetype, aggregateid, type, payload, bin, num, big, part, tenant)
				VALUES ($1, $2, $3, $4, $5::text::bytea, $6::numeric, $7::bigint, $8::int, $9) RETURNING id::text`,
				r.aggType, r.aggID, r.typ, r.payload, r.bin, r.num, r.big, r.part, r.tenant).Scan(&id)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, transactional := range []bool{true, false} {
		d.exec(t, `SELECT pg_logical_emit_message($1, $2, $3)`, transactional, parityPrefix, parityMessages[transactional])
	}

	pg := connectorParams(t, d.dsn)
	connector := func(i int, side string) map[string]string {
		c := map[string]string{
			"connector.class":             "io.debezium.connector.postgresql.PostgresConnector",
			"tasks.max":                   "1",
			"plugin.name":                 "pgoutput",
			"database.hostname":           pg.host,
			"database.port":               pg.port,
			"database.user":               pg.user,
			"database.password":           pg.password,
			"database.dbname":             d.name,
			"database.sslmode":            pg.sslmode,
			"topic.prefix":                fmt.Sprintf("parity%d", i),
			"slot.name":                   fmt.Sprintf("%s_%d_%s", side, i, d.name),
			"publication.name":            "parity",
			"publication.autocreate.mode": "disabled",
			"table.include.list":          `public\.pevents`,
			"snapshot.mode":               "no_data",
			"tombstones.on.delete":        "false",
			"extended.headers.enabled":    "false",
			"transforms":                  "outbox",
			"transforms.outbox.type":      "io.debezium.transforms.outbox.EventRouter",
			"transforms.outbox.route.topic.replacement": fmt.Sprintf("%s%d-%s-${routedByValue}", side, i, d.name),
		}
		for k, v := range parityConfigs[i].settings {
			c[k] = v
		}
		return c
	}

	// Kafka Connect standalone, one worker running every connector.
	dir := t.TempDir()
	worker := map[string]string{
		"bootstrap.servers":            strings.Join(svc.brokers, ","),
		"key.converter":                stringConv,
		"value.converter":              stringConv,
		"offset.storage.file.filename": filepath.Join(dir, "offsets"),
		"offset.flush.interval.ms":     "1000",
		"plugin.path":                  filepath.Join(cache, "debezium-"+parityDebezium, "plugins"),
		"listeners":                    fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
	}
	args := []string{"-Xms128m", "-Xmx768m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + absPath(t, "../bench/connect/log4j2.properties"),
		"-cp", filepath.Join(cache, "connect-"+parityConnect, "libs", "*"), "org.apache.kafka.connect.cli.ConnectStandalone",
		writeProperties(t, filepath.Join(dir, "worker.properties"), worker)}
	for i := range parityConfigs {
		c := connector(i, "dbz")
		c["name"] = fmt.Sprintf("parity-%d-%s", i, parityConfigs[i].name)
		args = append(args, writeProperties(t, filepath.Join(dir, fmt.Sprintf("connector%d.properties", i)), c))
	}
	connect := exec.Command("java", args...)
	connectLog := &testenv.Buffer{}
	connect.Stdout, connect.Stderr = connectLog, connectLog
	if err := connect.Start(); err != nil {
		t.Fatalf("starting Kafka Connect: %v", err)
	}
	connectDone := make(chan struct{})
	go func() { _ = connect.Wait(); close(connectDone) }()
	t.Cleanup(func() {
		_ = connect.Process.Kill()
		<-connectDone
		if t.Failed() {
			t.Logf("Kafka Connect log (last 30000 bytes):\n%s", tail(connectLog.String(), 30000))
		}
	})

	// outboxd, one process per configuration, each with the converted file.
	for i, pc := range parityConfigs {
		in, out := filepath.Join(dir, fmt.Sprintf("obx%d.json", i)), filepath.Join(dir, fmt.Sprintf("obx%d.yaml", i))
		data, _ := json.Marshal(map[string]any{"name": "parity", "config": connector(i, "obx")})
		if err := os.WriteFile(in, data, 0o600); err != nil {
			t.Fatal(err)
		}
		conv := exec.Command(svc.bin, "debezium", "convert", "-brokers", strings.Join(svc.brokers, ","), "-o", out, in)
		var stderr testenv.Buffer
		conv.Stderr = &stderr
		if err := conv.Run(); err != nil {
			t.Fatalf("%s: outboxd debezium convert: %v\n%s", pc.name, err, stderr.String())
		}
		env := append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "PGPASSWORD=" + pg.password,
			"OUTBOXD_HTTP_LISTEN=127.0.0.1:0", "OUTBOXD_POSTGRES_STATUS_INTERVAL=200ms"}, pc.env...)
		start(t, env, "-config", out)
	}

	// Every row in every configuration, and the messages: both from
	// Debezium, the transactional one from outboxd.
	perSide := len(ids) * len(parityConfigs)
	recs := readUntil(t, topics, 150*time.Second, 2*time.Second, func(recs []*kgo.Record) bool {
		n := map[byte]int{}
		for _, r := range recs {
			n[r.Topic[0]]++
		}
		return n['d'] >= perSide+2 && n['o'] >= perSide+1
	})
	diffs := parityDiff(recs)
	for _, diff := range diffs {
		if !parityDifferences[diff.kind] {
			t.Errorf("%s", diff)
		} else {
			t.Logf("allowed: %s", diff)
		}
	}
	t.Logf("compared %d records of %d rows in %d configurations; %d differences", len(recs), len(ids), len(parityConfigs), len(diffs))
}

// parityDifferences are the kinds of difference the migration guide lists
// under "Behaviour that differs" that these rows can show: the partition
// of a record with a null key, which each producer's sticky partitioner
// picks by itself, and a non-transactional message, which outboxd never
// delivers.
var parityDifferences = map[string]bool{"partition of a null key": true, "delivery of a non-transactional message": true}

type parityDifference struct {
	kind, config, id, detail string
}

func (d parityDifference) String() string {
	return fmt.Sprintf("configuration %s, event %s: %s differs: %s", d.config, d.id, d.kind, d.detail)
}

var sidePrefix = regexp.MustCompile(`^(dbz|obx)(\d+)-`)

// parityDiff pairs each Debezium record with outboxd's of the same
// configuration and event id, and lists what differs.
func parityDiff(recs []*kgo.Record) []parityDifference {
	type side struct {
		byID  map[string]*kgo.Record
		order map[string][]string // topic/partition -> event ids in offset order
	}
	sides := map[string]*side{}
	get := func(k string) *side {
		if sides[k] == nil {
			sides[k] = &side{byID: map[string]*kgo.Record{}, order: map[string][]string{}}
		}
		return sides[k]
	}
	for _, r := range recs {
		m := sidePrefix.FindStringSubmatch(r.Topic)
		if m == nil {
			continue
		}
		s := get(m[1] + m[2])
		id := header(r, "id")
		s.byID[id] = r
		if r.Key != nil && id != "msg-nontx" { // per-key order; a null key has none, outboxd never sends msg-nontx
			tp := fmt.Sprintf("%s/%d", strings.TrimPrefix(r.Topic, m[0]), r.Partition)
			s.order[tp] = append(s.order[tp], id)
		}
	}
	var diffs []parityDifference
	for i, pc := range parityConfigs {
		dbz, obx := get(fmt.Sprintf("dbz%d", i)), get(fmt.Sprintf("obx%d", i))
		add := func(kind, id, format string, args ...any) {
			diffs = append(diffs, parityDifference{kind, pc.name, id, fmt.Sprintf(format, args...)})
		}
		var idList []string
		for id := range dbz.byID {
			idList = append(idList, id)
		}
		for id := range obx.byID {
			if dbz.byID[id] == nil {
				idList = append(idList, id)
			}
		}
		sort.Strings(idList)
		for _, id := range idList {
			a, b := dbz.byID[id], obx.byID[id]
			switch {
			case b == nil && id == "msg-nontx":
				add("delivery of a non-transactional message", id, "Debezium sent it to %s, outboxd did not send it", a.Topic)
				continue
			case b == nil:
				add("delivery", id, "Debezium sent it to %s, outboxd did not send it", a.Topic)
				continue
			case a == nil:
				add("delivery", id, "outboxd sent it to %s, Debezium did not send it", b.Topic)
				continue
			}
			if ta, tb := sidePrefix.ReplaceAllString(a.Topic, ""), sidePrefix.ReplaceAllString(b.Topic, ""); ta != tb {
				add("topic", id, "Debezium %s, outboxd %s", a.Topic, b.Topic)
			}
			switch {
			case a.Partition != b.Partition && a.Key == nil && b.Key == nil:
				add("partition of a null key", id, "Debezium %d, outboxd %d", a.Partition, b.Partition)
			case a.Partition != b.Partition:
				add("partition", id, "Debezium %d, outboxd %d", a.Partition, b.Partition)
			}
			if !sameBytes(a.Key, b.Key) {
				add("key", id, "Debezium %s, outboxd %s", quoteBytes(a.Key), quoteBytes(b.Key))
			}
			if !sameBytes(a.Value, b.Value) {
				add("value", id, "Debezium %s, outboxd %s", quoteBytes(a.Value), quoteBytes(b.Value))
			}
			if ha, hb := headerList(a), headerList(b); ha != hb {
				add("headers", id, "Debezium %s, outboxd %s", ha, hb)
			}
		}
		for tp, order := range dbz.order {
			if got := strings.Join(obx.order[tp], ","); got != strings.Join(order, ",") {
				add("order", tp, "records with a key in topic/partition in another order: Debezium %v, outboxd %v", order, obx.order[tp])
			}
		}
	}
	return diffs
}

func sameBytes(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }

func quoteBytes(b []byte) string {
	if b == nil {
		return "null"
	}
	return fmt.Sprintf("%q", b)
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// headerList renders headers in order; Debezium's runId, a UUID chosen at
// each task start, is compared by its form.
func headerList(r *kgo.Record) string {
	var b strings.Builder
	for _, h := range r.Headers {
		v := quoteBytes(h.Value)
		if h.Key == "__debezium.context.runId" && uuidRE.Match(h.Value) {
			v = "<uuid>"
		}
		fmt.Fprintf(&b, "%s=%s;", h.Key, v)
	}
	return b.String()
}

// fetchConnect returns bench/fetch-connect's cache holding Kafka Connect
// and the Debezium connector of the pinned versions, fetching them from
// Maven Central the first time.
func fetchConnect(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("../bench/fetch-connect")
	cmd.Env = append(os.Environ(), "KAFKA_VERSION="+parityConnect, "DEBEZIUM_VERSION="+parityDebezium)
	var stderr testenv.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		skipOrFail(t, fmt.Sprintf("bench/fetch-connect could not fetch Kafka Connect %s and Debezium %s (it needs mvn and Maven Central): %v\n%s",
			parityConnect, parityDebezium, err, stderr.String()))
	}
	return strings.TrimSpace(string(out))
}

func createTopics(t *testing.T, partitions int32, topics []string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(svc.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := adm.CreateTopics(ctx, partitions, 1, nil, topics...)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Sorted() {
		if r.Err != nil {
			t.Fatalf("creating topic %s: %v", r.Topic, r.Err)
		}
	}
	t.Cleanup(func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(svc.brokers...))
		if err != nil {
			return
		}
		defer cl.Close()
		_, _ = kadm.NewClient(cl).DeleteTopics(context.Background(), topics...)
	})
}

// writeProperties writes a Java .properties file and returns its path.
func writeProperties(t *testing.T, path string, kv map[string]string) string {
	t.Helper()
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, strings.ReplaceAll(kv[k], `\`, `\\`))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func absPath(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
