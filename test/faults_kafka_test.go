package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ownKafka is a Kafka of the test's own, which it may kill and restart.
type ownKafka struct {
	t       *testing.T
	env     []string
	brokers []string
}

func startOwnKafka(t *testing.T, autoCreate bool) *ownKafka {
	t.Helper()
	requireServices(t)
	dir := t.TempDir()
	port, cport := freePort(t), freePort(t)
	k := &ownKafka{t: t, brokers: []string{fmt.Sprintf("127.0.0.1:%d", port)}, env: append(os.Environ(),
		"OUTBOXD_TESTBED_DIR="+dir, fmt.Sprintf("OUTBOXD_TESTBED_KAFKA_PORT=%d", port),
		fmt.Sprintf("OUTBOXD_TESTBED_KAFKA_CONTROLLER_PORT=%d", cport),
		fmt.Sprintf("OUTBOXD_TESTBED_KAFKA_AUTO_CREATE_TOPICS=%v", autoCreate),
		"OUTBOXD_TESTBED_KAFKA_HEAP=-Xmx512m -Xms128m")}
	k.run("kafka-start")
	t.Cleanup(func() { k.run("kafka-kill") })
	return k
}

func (k *ownKafka) run(script string) time.Duration {
	k.t.Helper()
	start := time.Now()
	cmd := exec.Command(filepath.Join("..", "scripts", "testbed", script))
	cmd.Env = k.env
	if out, err := cmd.CombinedOutput(); err != nil {
		k.t.Fatalf("%s: %v\n%s", script, err, out)
	}
	return time.Since(start)
}

// Scenarios 2 and 7 share one Kafka of their own (auto-creation off).
func TestFaultOwnKafka(t *testing.T) {
	k := startOwnKafka(t, false)
	t.Run("broker killed and restarted", func(t *testing.T) {
		d := newDB(t)
		env := replace(d.env(), "OUTBOXD_KAFKA_BROKERS", k.brokers[0])
		p := start(t, env)
		p.waitStreaming()
		spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 2,
			Events: pick(15000, 60000), TxSizes: []int{1, 10, 100}, RollbackPct: 5, Pace: 200 * time.Millisecond}
		f := startFaultRun(t, d, k.brokers, spec)
		kills := pick(1, 3)
		for range kills {
			waitCommitted(t, f.l, f.l.committedCount()+1000)
			k.run("kafka-kill")
			time.Sleep(20 * time.Second)
			t.Logf("broker restarted in %s", k.run("kafka-start"))
		}
		time.Sleep(3 * time.Second)
		k.run("kafka-stop") // clean restart
		t.Logf("clean broker restart in %s", k.run("kafka-start"))
		faultEnd := time.Now()
		f.finish("Kafka broker SIGKILL 20 s + clean restart", kills+1, faultEnd,
			fmt.Sprintf("%d kills of 20 s, 1 clean restart; outboxd restarts %s", kills, restarts(p)))
		select {
		case <-p.done:
			t.Errorf("outboxd exited during the broker outage: %v", p.err)
		default:
		}
	})
	t.Run("topic missing and auto-creation disabled", func(t *testing.T) {
		d := newDB(t)
		env := replace(d.env("OUTBOXD_KAFKA_TOPIC_CREATION=broker", "OUTBOXD_KAFKA_DELIVERY_TIMEOUT=3s"), "OUTBOXD_KAFKA_BROKERS", k.brokers[0])
		good, missing := d.name+"_ok", d.name+"_missing"
		admin := kadmOn(t, k.brokers)
		if _, err := admin.CreateTopic(context.Background(), 3, 1, nil, good+"-events"); err != nil {
			t.Fatal(err)
		}
		p := start(t, env)
		p.waitStreaming()
		l := newLedger()
		ins := func(typ string, key string, seq int) {
			e := event{ID: uuid(), Type: typ, Key: key, EventType: "Happened", Seq: seq}
			e.Payload = fmt.Sprintf(`{"k": "%s", "seq": %d}`, key, seq)
			d.exec(t, insertSQL, e.ID, e.Type, e.Key, e.EventType, e.Payload)
			l.add(true, e)
		}
		ins(good, "a", 1)
		c := collect(t, k.brokers, []string{good + "-events", missing + "-events"})
		c.waitFor(t, l.committedIDs(), 30*time.Second)
		ins(missing, "m", 1)
		stuckEnd := currentInsertLSN(t, d)
		for i := range 20 {
			ins(good, "a", 2+i)
			ins(missing, "m", 2+i)
		}
		// Three delivery timeouts: the pipeline restarts and nothing passes
		// the stuck transaction.
		time.Sleep(12 * time.Second)
		if got := d.confirmedFlush(t); got >= stuckEnd {
			t.Errorf("confirmed_flush_lsn %X passed the transaction stuck on a missing topic (ends by %X)", got, stuckEnd)
		}
		logs := p.logs.String()
		if !strings.Contains(logs, "the topic does not exist") {
			t.Errorf("no clear message about the missing topic in the log")
		}
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, "the topic does not exist") {
				t.Logf("message: %s", line)
				break
			}
		}
		if _, err := admin.CreateTopic(context.Background(), 3, 1, nil, missing+"-events"); err != nil {
			t.Fatal(err)
		}
		faultEnd := time.Now()
		recovered := c.waitFor(t, l.committedIDs(), 2*time.Minute)
		time.Sleep(2 * time.Second)
		topics := []string{good + "-events", missing + "-events"}
		r := check(l, c.records(), partitionsOn(t, k.brokers, topics))
		recordResult(t, result{Scenario: "topic missing, auto-creation off", Events: l.committedCount(), Faults: 1,
			Lost: len(r.Lost), Phantom: len(r.Phantom), Order: len(r.OrderViolations), Duplicates: r.Duplicates,
			RecoveryS: recovered.Sub(faultEnd).Seconds(), Note: "confirmed_flush_lsn held before the stuck transaction; restarts " + restarts(p)})
		r.failOnLoss(t)
	})
}

func kadmOn(t *testing.T, brokers []string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

func currentInsertLSN(t *testing.T, d *db) uint64 {
	t.Helper()
	var s string
	if err := d.pool.QueryRow(context.Background(), `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return parseLSN(t, s)
}
