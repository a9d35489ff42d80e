package test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Dead letters sent back (issue 35 item 4). Rows whose partition column
// names a partition the topic lacks are dead-lettered; "outboxd dlq list"
// shows them; a redrive while their topic still refuses them (its
// max.message.bytes too small) leaves them in the dead-letter topic with the
// new reason; after the fix a redrive sends them, with their key, payload and
// headers, and a second one sends nothing again. A consumer deduplicating
// on the id header sees each of the events once: 0 lost. In exactly-once
// mode a read_committed consumer sees each once without deduplicating. A row
// routing refused (a NULL key with router.require_key) has no record to send:
// redrive leaves its dead letter alone, every time.
func TestDLQRedrive(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(modeName(eos), func(t *testing.T) { testDLQRedrive(t, eos) })
	}
}

// dlqBed is a database whose outbox has a partition column, and the
// environment of an outboxd that dead-letters its poison rows.
type dlqBed struct {
	d               *db
	agg, topic, dlq string
	env             []string
	isolation       kgo.IsolationLevel // what the test's consumer reads
}

func newDLQBed(t *testing.T, eos bool) dlqBed {
	d := newDB(t)
	d.exec(t, `ALTER TABLE outbox ADD COLUMN shard int`)
	b := dlqBed{d: d, agg: d.name + "_ev", dlq: d.name + "_dlq"}
	b.topic = b.agg + "-events"
	extra := []string{"OUTBOXD_ROUTER_POISON_POLICY=dlq", "OUTBOXD_ROUTER_POISON_DLQ_TOPIC=" + b.dlq,
		"OUTBOXD_ROUTER_ADDITIONAL_FIELDS=shard:partition"}
	b.env, b.isolation = d.env(extra...), kgo.ReadUncommitted()
	if eos {
		b.env, b.isolation = eosEnv(d, extra...), kgo.ReadCommitted()
	}
	return b
}

func modeName(eos bool) string {
	if eos {
		return "exactly_once"
	}
	return "at_least_once"
}

func testDLQRedrive(t *testing.T, eos bool) {
	b := newDLQBed(t, eos)
	d, agg, topic, dlq, env := b.d, b.agg, b.topic, b.dlq, b.env
	c := collect(t, svc.brokers, []string{topic}, kgo.FetchIsolationLevel(b.isolation))
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
	keyless := uuid()
	d.exec(t, `ALTER TABLE outbox ALTER COLUMN aggregate_id DROP NOT NULL`)
	d.exec(t, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, NULL, 'Placed', '{}')`, keyless, agg)
	readUntil(t, []string{topic, dlq}, time.Minute, 0, waitIDs(append(all, keyless)...))

	// list shows the 5 dead letters, and the keyless row's, which
	// cannot be redriven.
	letters := dlqList(t, env, dlq)
	if len(letters) != len(dead)+1 {
		t.Fatalf("dlq list shows %d dead letters, want %d", len(letters), len(dead)+1)
	}
	for _, l := range letters {
		if l.ID == keyless {
			if !strings.Contains(l.Reason, "is NULL") || !strings.Contains(l.NotRedrivable, "outboxd replay") {
				t.Errorf("dlq list, the keyless row: %+v; want it not redrivable", l)
			}
			continue
		}
		if l.Topic != topic || !strings.Contains(l.Reason, "partition 99") || l.LSN == "" || l.Status != "pending" || l.NotRedrivable != "" {
			t.Errorf("dlq list: %+v", l)
		}
	}

	// Still failing: the topic refuses them; they stay, with the new reason.
	setMaxMessageBytes(t, topic, 100)
	out, code := dlqRun(t, env, "redrive", "-topic", dlq)
	if code != 1 || !strings.Contains(out, "redriven: 0, failed again: 5, not redrivable: 1") {
		t.Fatalf("redrive into a topic that refuses the records: exit %d, want 1 and 5 failed again:\n%s", code, out)
	}
	for _, l := range dlqList(t, env, dlq) {
		if l.ID != keyless && (!strings.Contains(l.Reason, "redrive: ") || !strings.Contains(l.Reason, "MESSAGE_TOO_LARGE")) {
			t.Errorf("after a failed redrive %s has reason %q, want the new one", l.ID, l.Reason)
		}
	}

	// Fixed: they go; twice sends nothing again.
	setMaxMessageBytes(t, topic, 1048588)
	// Exit 1 each time: the keyless row's dead letter is not redriven.
	if out, code := dlqRun(t, env, "redrive", "-topic", dlq); code != 1 || !strings.Contains(out, "redriven: 5, failed again: 0, not redrivable: 1") {
		t.Fatalf("redrive after the fix: exit %d:\n%s", code, out)
	}
	if out, code := dlqRun(t, env, "redrive", "-topic", dlq); code != 1 || !strings.Contains(out, "redriven: 0, failed again: 0, not redrivable: 1") {
		t.Fatalf("second redrive: exit %d:\n%s", code, out)
	}
	if ls := dlqList(t, env, dlq); len(ls) != 1 || ls[0].ID != keyless {
		t.Errorf("pending after the redrives: %+v; want the keyless row's alone", ls)
	}

	c.waitFor(t, all, time.Minute)
	time.Sleep(2 * time.Second) // for duplicates
	recs := c.records()
	seen := map[string]int{}
	_ = agg
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

// A redrive SIGKILLed part-way resumes: the next run sends what the killed
// one had not marked, and nothing it had. Deduplicated on the id header each
// event arrives once, 0 lost; in exactly_once a read_committed consumer sees
// each once without deduplicating (the killed run's open transaction is
// aborted when the next run starts).
func TestDLQRedriveSIGKILL(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(modeName(eos), func(t *testing.T) { testDLQRedriveSIGKILL(t, eos) })
	}
}

func testDLQRedriveSIGKILL(t *testing.T, eos bool) {
	b := newDLQBed(t, eos)
	c := collect(t, svc.brokers, []string{b.topic}, kgo.FetchIsolationLevel(b.isolation))
	const n = 2000
	all := b.deadLetters(t, n)

	r := start(t, b.env, "dlq", "redrive", "-topic", b.dlq, "-batch", "5")
	deadline := time.Now().Add(time.Minute)
	for c.missing(all) > 3*n/4 { // a quarter of them out
		select {
		case <-r.done:
			t.Fatalf("the redrive ended before a quarter of the records was seen:\n%s", r.logs.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("not a quarter of the records redriven within a minute")
		}
	}
	r.kill() // SIGKILL
	if r.cmd.ProcessState.Success() {
		t.Fatalf("the redrive finished before it was killed: nothing to resume")
	}
	seenAtKill := n - c.missing(all)

	out, code := dlqRun(t, b.env, "redrive", "-topic", b.dlq)
	m := regexp.MustCompile(`redriven: (\d+), failed again: 0, not redrivable: 0`).FindStringSubmatch(out)
	if m == nil || code != 0 {
		t.Fatalf("resumed redrive: exit %d:\n%s", code, out)
	}
	resumed, _ := strconv.Atoi(m[1])
	if resumed == 0 || resumed == n {
		t.Errorf("the resumed run redrove %d of %d: want those the killed run had not marked", resumed, n)
	}
	if left := len(dlqList(t, b.env, b.dlq)); left != 0 {
		t.Errorf("%d dead letters still pending", left)
	}
	lost, dups := c.lostAndRepeated(t, all)
	t.Logf("%s: %d dead letters; %d seen when the redrive was killed, %d redriven by the next run; %d lost, %d sent twice",
		modeName(eos), n, seenAtKill, resumed, lost, dups)
	if lost != 0 {
		t.Errorf("%d events lost", lost)
	}
	if eos && dups != 0 {
		t.Errorf("a read_committed consumer saw %d events twice in exactly_once", dups)
	}
	// A batch's markers are acknowledged before the next batch goes: a kill
	// leaves at most one batch sent and not marked.
	if dups > 5 {
		t.Errorf("%d events sent twice, more than one batch (-batch 5)", dups)
	}
}

// dlqLetter is a line of "outboxd dlq list -json".
type dlqLetter struct {
	ID     string `json:"event_id"`
	Reason string `json:"reason"`
	LSN    string `json:"source_lsn"`
	Topic  string `json:"intended_topic"`
	Status string `json:"status"`
	// IDHeader is the header the event id is in, as the dead letter says.
	IDHeader string `json:"id_header"`

	NotRedrivable string `json:"not_redrivable"`
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

// Two exactly-once redrives of one dead-letter topic overlap on a real
// broker (Kafka transactions version 1): the second one's Init fences the
// first, which ends saying so instead of sending again, and aborts its open
// transaction. A read_committed consumer sees every event once, 0 lost, and
// nothing is left pending (review-eos36fix R3: kfake neither aborts the open
// transaction at a second Init nor refuses a stale epoch as Kafka does, so
// only a real broker can show this).
func TestDLQRedriveOverlapping(t *testing.T) {
	b := newDLQBed(t, true)
	c := collect(t, svc.brokers, []string{b.topic}, kgo.FetchIsolationLevel(b.isolation))
	const n = 2000
	all := b.deadLetters(t, n)

	// A: small batches, so it is still running when B starts.
	a := start(t, b.env, "dlq", "redrive", "-topic", b.dlq, "-batch", "5")
	deadline := time.Now().Add(time.Minute)
	for c.missing(all) > 3*n/4 {
		select {
		case <-a.done:
			t.Fatalf("redrive A ended before a quarter of the records was seen:\n%s", a.logs.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("not a quarter of the records redriven within a minute")
		}
	}
	out, code := dlqRun(t, b.env, "redrive", "-topic", b.dlq) // B, while A runs
	codeA := a.waitExit(90 * time.Second)
	t.Logf("redrive A: exit %d\n%s", codeA, a.logs.String())
	if code != 0 || !regexp.MustCompile(`redriven: \d+, failed again: 0, not redrivable: 0`).MatchString(out) {
		t.Fatalf("redrive B: exit %d:\n%s", code, out)
	}
	// A either finished before B's Init reached the coordinator (exit 0)
	// or was fenced and says so; never an error that advises running it
	// again while B runs.
	if codeA != 0 && !strings.Contains(a.logs.String(), "fenced this one") {
		t.Errorf("redrive A exited %d without saying another redrive fenced it", codeA)
	}
	if left := len(dlqList(t, b.env, b.dlq)); left != 0 {
		t.Errorf("%d dead letters still pending after both redrives", left)
	}
	lost, dups := c.lostAndRepeated(t, all)
	t.Logf("%d dead letters, two overlapping exactly-once redrives: %d lost, %d seen twice by read_committed", n, lost, dups)
	if lost != 0 || dups != 0 {
		t.Errorf("%d lost, %d duplicates", lost, dups)
	}
}

// deadLetters has outboxd dead-letter n poison rows (their partition column
// names a partition the topic lacks), waits until the dead-letter topic
// holds them all and stops outboxd; it returns their event ids.
func (b dlqBed) deadLetters(t *testing.T, n int) []string {
	t.Helper()
	p := start(t, b.env)
	p.waitStreaming()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := b.d.pool.Query(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, shard)
		SELECT gen_random_uuid(), $1, 'k-' || (g % 7), 'Placed', jsonb_build_object('n', g), 99 FROM generate_series(1, $2) g
		RETURNING id::text`, b.agg, n)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		all = append(all, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	readUntil(t, []string{b.dlq}, time.Minute, 0, waitIDs(all...))
	if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("outboxd exited %d on SIGTERM", code)
	}
	return all
}

// lostAndRepeated waits until c has every event of all (or a minute), two
// seconds more for repeats, and counts those it never saw and the extra
// copies of the others, by the id header.
func (c *collector) lostAndRepeated(t *testing.T, all []string) (lost, dups int) {
	t.Helper()
	c.waitFor(t, all, time.Minute)
	time.Sleep(2 * time.Second) // for duplicates
	lost, dups, _ = tally(c.records(), all, func(r *kgo.Record) string { return header(r, "id") })
	return lost, dups
}

// tally counts the events of all that recs lack, the extra copies of the
// others, and the records of no event of all (phantoms), reading each
// record's event id with idOf.
func tally(recs []*kgo.Record, all []string, idOf func(*kgo.Record) string) (lost, dups, phantoms int) {
	seen := map[string]int{}
	for _, rec := range recs {
		seen[idOf(rec)]++
	}
	for _, id := range all {
		if seen[id] == 0 {
			lost++
		}
		dups += max(seen[id]-1, 0)
		delete(seen, id)
	}
	for _, n := range seen {
		phantoms += n
	}
	return lost, dups, phantoms
}

// setMaxMessageBytes sets topic's max.message.bytes to v and returns once
// the leader of each of its partitions enforces it. AlterConfigs returns
// when the controller has committed the change; a broker applies it to its
// logs later, when it replays the metadata, and DescribeConfigs can read the
// new value from the broker's metadata image before its logs use it (a
// redrive right after met MESSAGE_TOO_LARGE once). So it polls
// DescribeConfigs until the value reads back, then probes every partition
// with two record batches whose CRC is wrong, v+1 and v bytes long: a
// leader checks a batch's size against its log's max.message.bytes before
// the CRC, so the first must be refused as MESSAGE_TOO_LARGE and the second
// as CORRUPT_MESSAGE once the log has the new value. Neither is appended:
// the topic's consumers see nothing of the probes.
func setMaxMessageBytes(t *testing.T, topic string, v int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(svc.brokers...), kgo.MetadataMinAge(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	val := strconv.Itoa(v)
	rs, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &val}}, topic)
	if err == nil {
		_, err = rs.On(topic, nil)
	}
	if err != nil {
		t.Fatalf("setting max.message.bytes of %s to %d: %v", topic, v, err)
	}
	md, err := adm.Metadata(ctx, topic)
	if err == nil {
		err = md.Topics.Error()
	}
	if err != nil {
		t.Fatalf("metadata of %s: %v", topic, err)
	}
	td := md.Topics[topic]
	probes := []struct {
		size int
		want error
	}{{v + 1, kerr.MessageTooLarge}, {v, kerr.CorruptMessage}}
	start, rounds := time.Now(), 0
	var last string
	for rounds = 1; ; rounds++ {
		last = ""
		rcs, err := adm.DescribeTopicConfigs(ctx, topic)
		if err != nil {
			last = err.Error()
		} else if c, err := rcs.On(topic, nil); err != nil {
			last = err.Error()
		} else if got := configValue(c.Configs, "max.message.bytes"); got != val {
			last = fmt.Sprintf("DescribeConfigs reads %s", got)
		}
		for _, p := range td.Partitions.Sorted() {
			for _, pr := range probes {
				if last != "" {
					break
				}
				if err := produceCorrupt(ctx, cl, td, p, pr.size); !errors.Is(err, pr.want) {
					last = fmt.Sprintf("partition %d refuses a %d-byte batch with %v, want %v", p.Partition, pr.size, err, pr.want)
				}
			}
		}
		if last == "" {
			t.Logf("max.message.bytes of %s is %d on every partition after %s (%d rounds)", topic, v, time.Since(start).Round(time.Millisecond), rounds)
			return
		}
		if rounds == 1 || ctx.Err() != nil {
			t.Logf("max.message.bytes of %s not yet %d: %s", topic, v, last)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("max.message.bytes of %s set to %d is not in force after 30s: %s", topic, v, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func configValue(cs []kadm.Config, name string) string {
	for _, c := range cs {
		if c.Key == name && c.Value != nil {
			return *c.Value
		}
	}
	return ""
}

// produceCorrupt sends partition p's leader a record batch of size bytes
// whose CRC is wrong, and returns the partition's error.
func produceCorrupt(ctx context.Context, cl *kgo.Client, td kadm.TopicDetail, p kadm.PartitionDetail, size int) error {
	const batchHeader = 61 // RecordBatch v2 before its records
	varintLen := func(x int) int { return len(binary.AppendVarint(nil, int64(x))) }
	bodyLen := func(n int) int { return 4 + varintLen(n) + n + 1 }
	n := size - batchHeader
	for n > 0 && batchHeader+varintLen(bodyLen(n))+bodyLen(n) > size {
		n-- // the value's length, so that the batch is size bytes
	}
	if n <= 0 || batchHeader+varintLen(bodyLen(n))+bodyLen(n) != size {
		return fmt.Errorf("no batch of %d bytes", size)
	}
	rec := binary.AppendVarint(nil, int64(bodyLen(n)))
	rec = append(rec, 0, 0, 0, 1) // attributes, timestamp delta, offset delta, key length -1
	rec = binary.AppendVarint(rec, int64(n))
	rec = append(rec, make([]byte, n)...)
	rec = append(rec, 0) // no headers
	batch := kmsg.RecordBatch{
		Length: int32(size - 12), Magic: 2, CRC: 1, // wrong
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: 1, Records: rec,
	}
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, 10000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic, rt.TopicID = td.Topic, td.ID
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Partition, rp.Records = p.Partition, batch.AppendTo(nil)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl.Broker(int(p.Leader)))
	if err != nil {
		return err
	}
	for _, t := range resp.Topics {
		for _, rp := range t.Partitions {
			return kerr.ErrorForCode(rp.ErrorCode)
		}
	}
	return fmt.Errorf("no partition in the produce response")
}
