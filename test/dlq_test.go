package test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Dead letters sent back (issue 35 item 4). Rows whose partition column
// names a partition the topic lacks are dead-lettered; "outboxd dlq list"
// shows them; a redrive while their topic still refuses them (its
// max.message.bytes too small) leaves them in the dead-letter topic with the
// new reason; after the fix a redrive sends them, with their key, payload and
// headers, and a second one sends nothing again. A consumer deduplicating
// on the id header sees each of the events once: 0 lost. In exactly-once
// mode a read_committed consumer sees each once without deduplicating.
func TestDLQRedrive(t *testing.T) {
	for _, eos := range []bool{false, true} {
		name := "at_least_once"
		if eos {
			name = "exactly_once"
		}
		t.Run(name, func(t *testing.T) { testDLQRedrive(t, eos) })
	}
}

func testDLQRedrive(t *testing.T, eos bool) {
	d := newDB(t)
	d.exec(t, `ALTER TABLE outbox ADD COLUMN shard int`)
	agg, dlq := d.name+"_ev", d.name+"_dlq"
	topic := agg + "-events"
	extra := []string{"OUTBOXD_ROUTER_POISON_POLICY=dlq", "OUTBOXD_ROUTER_POISON_DLQ_TOPIC=" + dlq,
		"OUTBOXD_ROUTER_ADDITIONAL_FIELDS=shard:partition"}
	env := d.env(extra...)
	isolation := kgo.ReadUncommitted()
	if eos {
		env, isolation = eosEnv(d, extra...), kgo.ReadCommitted()
	}
	c := collect(t, svc.brokers, []string{topic}, kgo.FetchIsolationLevel(isolation))
	p := start(t, env)
	p.waitStreaming()

	var all, dead []string
	for i := range 20 {
		id := uuid()
		var shard any // NULL: the key's partition
		if i%4 == 1 {
			shard, dead = 99, append(dead, id)
		}
		d.exec(t, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, shard) VALUES ($1, $2, $3, 'Placed', $4, $5)`,
			id, agg, fmt.Sprintf("k-%d", i%3), fmt.Sprintf(`{"n": %d, "pad": "%s"}`, i, strings.Repeat("x", 100)), shard)
		all = append(all, id)
	}
	readUntil(t, []string{topic, dlq}, time.Minute, 0, waitIDs(all...))

	// list shows the 5 dead letters.
	letters := dlqList(t, env, dlq)
	if len(letters) != len(dead) {
		t.Fatalf("dlq list shows %d dead letters, want %d", len(letters), len(dead))
	}
	for _, l := range letters {
		if l.Topic != topic || !strings.Contains(l.Reason, "partition 99") || l.LSN == "" || l.Status != "pending" {
			t.Errorf("dlq list: %+v", l)
		}
	}

	// Still failing: the topic refuses them; they stay, with the new reason.
	adm := kadm.NewClient(kafkaClient(t))
	setMax := func(v string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		rs, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &v}}, topic)
		if err == nil {
			_, err = rs.On(topic, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	setMax("100")
	out, code := dlqRun(t, env, "redrive", "-topic", dlq)
	if code != 1 || !strings.Contains(out, "redriven: 0, failed again: 5") {
		t.Fatalf("redrive into a topic that refuses the records: exit %d, want 1 and 5 failed again:\n%s", code, out)
	}
	for _, l := range dlqList(t, env, dlq) {
		if !strings.Contains(l.Reason, "redrive: ") || !strings.Contains(l.Reason, "MESSAGE_TOO_LARGE") {
			t.Errorf("after a failed redrive %s has reason %q, want the new one", l.ID, l.Reason)
		}
	}

	// Fixed: they go; twice sends nothing again.
	setMax("1048588")
	if out, code := dlqRun(t, env, "redrive", "-topic", dlq); code != 0 || !strings.Contains(out, "redriven: 5, failed again: 0") {
		t.Fatalf("redrive after the fix: exit %d:\n%s", code, out)
	}
	if out, code := dlqRun(t, env, "redrive", "-topic", dlq); code != 0 || !strings.Contains(out, "redriven: 0, failed again: 0") {
		t.Fatalf("second redrive: exit %d:\n%s", code, out)
	}
	if n := len(dlqList(t, env, dlq)); n != 0 {
		t.Errorf("%d dead letters still pending", n)
	}

	c.waitFor(t, all, time.Minute)
	time.Sleep(2 * time.Second) // for duplicates
	recs := c.records()
	seen := map[string]int{}
	for _, r := range recs {
		id := header(r, "id")
		seen[id]++
		if header(r, "outboxd.error.reason") != "" || header(r, "outboxd.dlq.redriven") != "" || header(r, "eventType") != "Placed" {
			t.Errorf("record %s on %s has headers %v: want the original's", id, topic, r.Headers)
		}
		if want := javaPartition(r.Key, partitionsOf(t, topic)[topic]); r.Partition != want {
			t.Errorf("record %s (key %s) on partition %d, murmur2 gives %d", id, r.Key, r.Partition, want)
		}
	}
	lost := 0
	for _, id := range all {
		if seen[id] == 0 {
			lost++
		}
	}
	dups := 0
	for _, id := range all {
		dups += max(seen[id]-1, 0)
	}
	t.Logf("%d events, %d dead-lettered and redriven: %d lost, %d duplicates", len(all), len(dead), lost, dups)
	if lost != 0 || dups != 0 {
		t.Errorf("%d lost, %d duplicates", lost, dups)
	}
	p.kill()
}

// dlqLetter is a line of "outboxd dlq list -json".
type dlqLetter struct {
	ID     string `json:"event_id"`
	Reason string `json:"reason"`
	LSN    string `json:"source_lsn"`
	Topic  string `json:"intended_topic"`
	Status string `json:"status"`
}

// dlqRun runs "outboxd dlq ARGS" and returns its output and exit code.
func dlqRun(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	p := start(t, env, append([]string{"dlq"}, args...)...)
	code := p.waitExit(90 * time.Second)
	out := p.logs.String()
	t.Logf("outboxd dlq %s: exit %d\n%s", strings.Join(args, " "), code, out)
	return out, code
}

// dlqList returns the pending dead letters of topic.
func dlqList(t *testing.T, env []string, topic string) []dlqLetter {
	t.Helper()
	out, code := dlqRun(t, env, "list", "-json", "-topic", topic)
	if code != 0 {
		t.Fatalf("dlq list: exit %d", code)
	}
	var ls []dlqLetter
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var l dlqLetter
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("dlq list -json: %v in\n%s", err, out)
		}
		ls = append(ls, l)
	}
	return ls
}
