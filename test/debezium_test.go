package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/internal/testenv"
)

// dbzEvent is an outbox row written to a Debezium-style table.
type dbzEvent struct {
	ID, AggregateType, AggregateID, Type, Payload string // Payload: payload::text
}

// TestDebeziumConvertedConfigReproducesEventRouter migrates a Debezium
// connector: its JSON configuration (EventRouter, JsonConverter keys, the
// type placed as header eventType) goes through 'outboxd debezium convert',
// and outboxd, run with the converted file on the slot and publication
// Debezium left behind, must produce what the EventRouter would have:
// topics, JSON-string keys, Java murmur2 partitions of those key bytes,
// headers id and eventType, and values equal to payload::text.
func TestDebeziumConvertedConfigReproducesEventRouter(t *testing.T) {
	d := newDB(t)
	ctx := context.Background()
	// Debezium's outbox table, publication (publication.autocreate.mode
	// all_tables) and pgoutput slot, as a stopped connector leaves them.
	d.exec(t, `CREATE TABLE public.outboxevent (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
		aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL,
		type varchar(255) NOT NULL,
		payload jsonb)`)
	d.exec(t, `CREATE PUBLICATION dbz_publication FOR ALL TABLES`)
	d.exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, d.slot)

	pc := connectorParams(t, svc.pgDSN)
	host, port, user, sslmode := pc.host, pc.port, pc.user, pc.sslmode
	// The test server may trust local connections; the password must reach
	// outboxd through PGPASSWORD either way, and never through the file.
	password := pc.password
	if password == "" {
		password = "dbz-pw-" + randomSuffix()
	}
	connector := map[string]any{
		"name": "outbox-connector",
		"config": map[string]string{
			"connector.class":                   "io.debezium.connector.postgresql.PostgresConnector",
			"tasks.max":                         "1",
			"database.hostname":                 host,
			"database.port":                     port,
			"database.user":                     user,
			"database.password":                 password,
			"database.dbname":                   d.name,
			"database.sslmode":                  sslmode,
			"topic.prefix":                      "dbserver1",
			"plugin.name":                       "pgoutput",
			"slot.name":                         d.slot,
			"publication.name":                  "dbz_publication",
			"table.include.list":                `public\.outboxevent`,
			"tombstones.on.delete":              "false",
			"snapshot.mode":                     "no_data",
			"key.converter":                     "org.apache.kafka.connect.json.JsonConverter",
			"key.converter.schemas.enable":      "false",
			"value.converter":                   "org.apache.kafka.connect.storage.StringConverter",
			"topic.creation.default.partitions": "6",
			"topic.creation.default.replication.factor": "1",
			"transforms":             "outbox",
			"transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
			"transforms.outbox.route.topic.replacement":           "outbox.event.${routedByValue}",
			"transforms.outbox.table.fields.additional.placement": "type:header:eventType",
			"transforms.outbox.table.op.invalid.behavior":         "warn",
		},
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "connector.json"), filepath.Join(dir, "outboxd.yaml")
	data, _ := json.MarshalIndent(connector, "", "  ")
	if err := os.WriteFile(in, data, 0o600); err != nil {
		t.Fatal(err)
	}
	conv := exec.Command(svc.bin, "debezium", "convert", "-brokers", strings.Join(svc.brokers, ","), "-o", out, in)
	conv.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	var stdout, stderr testenv.Buffer
	conv.Stdout, conv.Stderr = &stdout, &stderr
	if err := conv.Run(); err != nil {
		t.Fatalf("outboxd debezium convert: %v\n%s", err, stderr.String())
	}
	converted, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("converted configuration:\n%s\nwarnings:\n%s", converted, stderr.String())
	for what, s := range map[string]string{"stdout": stdout.String(), "stderr": stderr.String(), "the output file": string(converted)} {
		if strings.Contains(s, password) {
			t.Fatalf("the database password appears in %s", what)
		}
	}
	if !strings.Contains(stderr.String(), "PGPASSWORD") {
		t.Errorf("convert did not say how to supply the password:\n%s", stderr.String())
	}

	// Events committed after Debezium stopped and before outboxd starts are
	// in the slot: outboxd must deliver them.
	var want []dbzEvent
	write := func(txs [][]dbzEvent, deleteInTx, rollback bool) {
		t.Helper()
		for _, evs := range txs {
			tx, err := d.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var got []dbzEvent
			for _, e := range evs {
				err := tx.QueryRow(ctx, `INSERT INTO outboxevent (aggregatetype, aggregateid, type, payload)
					VALUES ($1, $2, $3, $4::jsonb) RETURNING id::text, payload::text`,
					e.AggregateType, e.AggregateID, e.Type, e.Payload).Scan(&e.ID, &e.Payload)
				if err != nil {
					t.Fatal(err)
				}
				if deleteInTx {
					if _, err := tx.Exec(ctx, `DELETE FROM outboxevent WHERE id = $1`, e.ID); err != nil {
						t.Fatal(err)
					}
				}
				got = append(got, e)
			}
			if rollback {
				_ = tx.Rollback(ctx)
				continue
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			want = append(want, got...)
		}
	}
	order, customer := d.name+"_order", d.name+"_customer"
	batch := func(seq, n int) [][]dbzEvent {
		var txs [][]dbzEvent
		for i := range n {
			var tx []dbzEvent
			for j := range 1 + i%3 {
				k := seq*100 + i*10 + j
				agg, typ := order, "OrderCreated"
				if k%2 == 1 {
					agg, typ = customer, "CustomerUpdated"
				}
				tx = append(tx, dbzEvent{
					AggregateType: agg, AggregateID: fmt.Sprintf("agg-%d", k%7), Type: typ,
					Payload: fmt.Sprintf(`{"seq": %d, "name": "naïve \"quoted\"", "items": [1, 2.50, {"b": true, "a": null}]}`, k),
				})
			}
			txs = append(txs, tx)
		}
		return txs
	}
	write(batch(1, 5), false, false)

	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"PGPASSWORD=" + password,
		"OUTBOXD_POSTGRES_STATUS_INTERVAL=200ms",
		"OUTBOXD_HTTP_LISTEN=127.0.0.1:0",
		"OUTBOXD_LOG_LEVEL=debug",
	}
	p := start(t, env, "-config", out)
	p.waitStreaming()
	if strings.Contains(p.logs.String(), "created replication slot") {
		t.Errorf("outboxd created a slot; it must resume Debezium's")
	}

	write(batch(2, 6), true, false) // insert and delete in one transaction
	write(batch(3, 2), false, true) // rolled back: never delivered
	write(batch(4, 4), false, false)
	d.exec(t, `UPDATE outboxevent SET type = 'Changed' WHERE id = $1`, want[0].ID) // skipped, as Debezium's warn does

	topics := []string{"outbox.event." + order, "outbox.event." + customer}
	ids := map[string]int{}
	for i, e := range want {
		ids[e.ID] = i
	}
	recs := readUntil(t, topics, time.Minute, 2*time.Second, func(recs []*kgo.Record) bool {
		seen := map[string]bool{}
		for _, r := range recs {
			seen[header(r, "id")] = true
		}
		for id := range ids {
			if !seen[id] {
				return false
			}
		}
		return true
	})
	parts := partitionsOf(t, topics...)
	for _, topic := range topics {
		if parts[topic] != 6 {
			t.Errorf("topic %s has %d partitions, want 6 (topic.creation.default.partitions)", topic, parts[topic])
		}
	}
	seen := map[string]bool{}
	last := map[string]int{} // topic/key -> index in want of the last record read
	for _, r := range recs {
		id := header(r, "id")
		i, ok := ids[id]
		if !ok {
			t.Errorf("record with id %q at %s/%d@%d was never committed", id, r.Topic, r.Partition, r.Offset)
			continue
		}
		if seen[id] {
			t.Errorf("event %s delivered twice", id)
		}
		seen[id] = true
		e := want[i]
		wantKey, _ := json.Marshal(e.AggregateID)
		switch {
		case r.Topic != "outbox.event."+e.AggregateType:
			t.Errorf("event %s: topic %s, want outbox.event.%s", id, r.Topic, e.AggregateType)
		case string(r.Key) != string(wantKey):
			t.Errorf("event %s: key %s, want JsonConverter's %s", id, r.Key, wantKey)
		case r.Partition != javaPartition(wantKey, parts[r.Topic]):
			t.Errorf("event %s: partition %d, Java's murmur2 of %s gives %d", id, r.Partition, wantKey, javaPartition(wantKey, parts[r.Topic]))
		case string(r.Value) != e.Payload:
			t.Errorf("event %s: value %q, want payload::text %q", id, r.Value, e.Payload)
		case len(r.Headers) != 2 || r.Headers[0].Key != "id" || r.Headers[1].Key != "eventType":
			t.Errorf("event %s: headers %v, want id then eventType", id, r.Headers)
		case string(r.Headers[0].Value) != e.ID || string(r.Headers[1].Value) != e.Type:
			t.Errorf("event %s: headers id=%s eventType=%s, want %s, %s", id, r.Headers[0].Value, r.Headers[1].Value, e.ID, e.Type)
		}
		k := r.Topic + "/" + string(r.Key)
		if prev, ok := last[k]; ok && i < prev {
			t.Errorf("key %s: event %d read after event %d, against commit order", k, i, prev)
		}
		last[k] = i
	}
	if len(seen) != len(want) {
		t.Errorf("read %d of %d committed events", len(seen), len(want))
	}
	t.Logf("%d events in %d records, as Debezium's EventRouter would have written them", len(want), len(recs))

	// outboxd confirms what it delivered on Debezium's slot.
	target := currentLSN(t, d)
	deadline := time.Now().Add(10 * time.Second)
	for d.confirmedFlush(t) < target && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if got := d.confirmedFlush(t); got < target {
		t.Errorf("slot %s confirmed %X, want at least %X after every event was delivered", d.slot, got, target)
	}
}

// pgParams are a DSN's parts as a Debezium connector configuration names
// them.
type pgParams struct {
	host, port, user, password, sslmode string
}

func connectorParams(t *testing.T, dsn string) pgParams {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("the test DSN is not a URL: %v", err)
	}
	p := pgParams{user: u.User.Username(), sslmode: u.Query().Get("sslmode")}
	if p.host, p.port, err = net.SplitHostPort(u.Host); err != nil {
		p.host, p.port = u.Host, "5432"
	}
	p.password, _ = u.User.Password()
	if p.sslmode == "" {
		p.sslmode = "prefer"
	}
	return p
}
