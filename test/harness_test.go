package test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/wal"
)

// db is one throwaway database with the outbox table, and a slot name that is
// unique in the cluster.
type db struct {
	name string
	dsn  string
	pool *pgxpool.Pool
	slot string
}

// randomSuffix returns 8 random hex digits for unique names.
func randomSuffix() string { return testenv.RandomSuffix() }

var unsafeChars = regexp.MustCompile(`[^a-z0-9_]+`)

// newDB creates a database named after the test, with the outbox table;
// cleanup drops its slots and the database.
func newDB(t *testing.T) *db {
	t.Helper()
	requireServices(t)
	ctx := context.Background()
	prefix := unsafeChars.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(prefix) > 38 {
		prefix = prefix[:38]
	}
	name, dsn := testenv.CreateDatabase(t, svc.pgDSN, prefix)
	d := &db{name: name, dsn: dsn, slot: name}
	var err error
	d.pool, err = pgxpool.New(ctx, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.pool.Close) // before the database is dropped
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.Apply(ctx, conn.Conn(), "public", "outbox"); err != nil {
		t.Fatal(err)
	}
	conn.Release()
	return d
}

// exec runs SQL on the test database.
func (d *db) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := d.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// replicationConn opens a replication connection (replication=database) to
// the test database; cleanup closes it if the test has not.
func (d *db) replicationConn(t *testing.T) *pgconn.PgConn {
	t.Helper()
	cfg, err := pgconn.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("opening a replication connection: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// confirmedFlush returns the slot's confirmed_flush_lsn (0 when missing).
func (d *db) confirmedFlush(t *testing.T) uint64 {
	t.Helper()
	var lsn *string
	err := d.pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, d.slot).Scan(&lsn)
	if err == pgx.ErrNoRows || lsn == nil {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return parseLSN(t, *lsn)
}

// parseLSN parses Postgres' text form of an LSN.
func parseLSN(t *testing.T, s string) uint64 {
	t.Helper()
	lsn, err := wal.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(lsn)
}

// proc is a running outboxd.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	logs *testenv.Buffer
	done chan struct{}
	err  error // set when done is closed
	addr string
}

// baseEnv is the environment for an outboxd streaming database d.
func (d *db) env(extra ...string) []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"OUTBOXD_POSTGRES_DSN=" + d.dsn,
		"OUTBOXD_POSTGRES_SLOT=" + d.slot,
		"OUTBOXD_POSTGRES_STATUS_INTERVAL=200ms",
		"OUTBOXD_POSTGRES_SLOT_LAG_INTERVAL=200ms",
		"OUTBOXD_KAFKA_BROKERS=" + strings.Join(svc.brokers, ","),
		"OUTBOXD_KAFKA_TOPIC_PARTITIONS=6",
		"OUTBOXD_KAFKA_TOPIC_REPLICATION_FACTOR=1",
		"OUTBOXD_HTTP_LISTEN=127.0.0.1:0",
		"OUTBOXD_LOG_LEVEL=debug",
	}
	return append(env, extra...)
}

var listenRE = regexp.MustCompile(`msg="serving metrics and health" addr=(\S+)`)

// start runs outboxd with env; the process is killed at cleanup, and its log
// is shown if the test failed.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, logs: &testenv.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(svc.bin, args...)
	p.cmd.Env = env
	p.cmd.Stdout = p.logs
	p.cmd.Stderr = p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting outboxd: %v", err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("outboxd (pid %d) log:\n%s", p.cmd.Process.Pid, p.logs.String())
		}
	})
	return p
}

func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// signal sends sig and waits up to timeout for the exit; it returns the exit code.
func (p *proc) stop(sig syscall.Signal, timeout time.Duration) int {
	p.t.Helper()
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("outboxd did not exit within %s of %s", timeout, sig)
	}
	return p.cmd.ProcessState.ExitCode()
}

// waitExit waits for the process to exit by itself and returns its exit code.
func (p *proc) waitExit(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		p.t.Fatalf("outboxd still running after %s; log:\n%s", timeout, p.logs.String())
		return -1
	}
}

// waitLog waits until the log matches re.
func (p *proc) waitLog(re string, timeout time.Duration) string {
	p.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if m := rx.FindString(p.logs.String()); m != "" {
			return m
		}
		select {
		case <-p.done:
			if m := rx.FindString(p.logs.String()); m != "" {
				return m
			}
			p.t.Fatalf("outboxd exited (%v) before logging %q", p.err, re)
		case <-time.After(50 * time.Millisecond):
		}
	}
	p.t.Fatalf("outboxd did not log %q within %s", re, timeout)
	return ""
}

// waitStreaming waits until outboxd holds the slot and serves HTTP.
func (p *proc) waitStreaming() {
	p.t.Helper()
	m := listenRE.FindStringSubmatch(p.waitLog(`msg="serving metrics and health" addr=\S+`, 30*time.Second))
	p.addr = m[1]
	p.waitLog(`msg=streaming`, 30*time.Second)
}

// metric returns the value of an unlabelled metric from /metrics.
func (p *proc) metric(name string) (float64, bool) {
	mfs, ok := p.scrape()
	if !ok {
		return 0, false
	}
	return seriesValue(mfs, name, nil)
}

// scrape reads /metrics with the Prometheus text parser; false when the
// process does not answer or the exposition does not parse.
func (p *proc) scrape() (map[string]*dto.MetricFamily, bool) {
	resp, err := http.Get("http://" + p.addr + "/metrics")
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		p.t.Logf("parsing /metrics: %v", err)
		return nil, false
	}
	return mfs, true
}

// familySum returns the sum of every series of the counter or gauge name in
// mfs (0 when there is none): a sharded instance labels each shard's.
func familySum(mfs map[string]*dto.MetricFamily, name string) float64 {
	var sum float64
	if f, ok := mfs[name]; ok {
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
		}
	}
	return sum
}

// seriesValue returns the value of the series name{labels} in mfs (its labels
// exactly those given): a counter, gauge or untyped sample, or the _sum or
// _count of a histogram or summary.
func seriesValue(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	family, suffix := name, ""
	if _, ok := mfs[name]; !ok {
		for _, sfx := range []string{"_sum", "_count"} {
			if base, cut := strings.CutSuffix(name, sfx); cut {
				family, suffix = base, sfx
			}
		}
	}
	mf, ok := mfs[family]
	if !ok {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		match := true
		for _, l := range m.GetLabel() {
			if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case suffix == "_sum" && m.Histogram != nil:
			return m.GetHistogram().GetSampleSum(), true
		case suffix == "_count" && m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		case suffix == "_sum" && m.Summary != nil:
			return m.GetSummary().GetSampleSum(), true
		case suffix == "_count" && m.Summary != nil:
			return float64(m.GetSummary().GetSampleCount()), true
		case suffix != "":
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// rssPeakKB returns the process's peak resident set size (VmHWM) in KiB.
func (p *proc) rssPeakKB() int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		p.t.Fatalf("reading /proc status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			var kb int
			fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:")), "%d", &kb)
			return kb
		}
	}
	p.t.Fatal("no VmHWM in /proc status")
	return 0
}

// kafkaClient returns a consumer of topics from their start.
func kafkaClient(t *testing.T, topics ...string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(svc.brokers...),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(250*time.Millisecond),
		kgo.FetchMaxWait(200*time.Millisecond),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// readUntil consumes topics until done says so (or timeout), then keeps
// reading for settle to catch duplicates, and returns every record.
func readUntil(t *testing.T, topics []string, timeout, settle time.Duration, done func([]*kgo.Record) bool) []*kgo.Record {
	t.Helper()
	cl := kafkaClient(t, topics...)
	var recs []*kgo.Record
	deadline := time.Now().Add(timeout)
	var settleAt time.Time
	for {
		now := time.Now()
		if settleAt.IsZero() && done(recs) {
			settleAt = now.Add(settle)
		}
		if !settleAt.IsZero() && now.After(settleAt) {
			return recs
		}
		if now.After(deadline) {
			t.Errorf("timed out after %s reading Kafka with %d records", timeout, len(recs))
			return recs
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachError(func(topic string, p int32, err error) {
			if err != context.DeadlineExceeded && !strings.Contains(err.Error(), "UNKNOWN_TOPIC") {
				t.Logf("fetch %s/%d: %v", topic, p, err)
			}
		})
		recs = append(recs, fs.Records()...)
	}
}

// partitionsOf returns the partition count of each topic on the shared
// Kafka.
func partitionsOf(t *testing.T, topics ...string) map[string]int {
	t.Helper()
	return partitionsOn(t, svc.brokers, topics)
}

// verifyLoad waits for the load to finish, reads every topic it wrote to
// until all committed events are in Kafka, and checks them: any lost,
// phantom, out-of-order or misrouted event fails t.
func verifyLoad(t *testing.T, l *ledger, loadDone <-chan error) report {
	t.Helper()
	if err := <-loadDone; err != nil {
		t.Fatal(err)
	}
	topics := l.topics()
	recs := readUntil(t, topics, 2*time.Minute, 2*time.Second, allDelivered(l))
	r := check(l, recs, partitionsOf(t, topics...))
	t.Logf("%s", r)
	r.failOnLoss(t)
	return r
}

// serverMajor returns the major version of the Postgres at OUTBOXD_TEST_PG_DSN.
func serverMajor(t *testing.T) int {
	t.Helper()
	requireServices(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, svc.pgDSN)
	if err != nil {
		t.Fatalf("connecting to Postgres at OUTBOXD_TEST_PG_DSN: %v", err)
	}
	defer conn.Close(ctx)
	var num int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&num); err != nil {
		t.Fatalf("reading server_version_num: %v", err)
	}
	return num / 10000
}

// refusedBefore reports whether the server's major version predates major,
// the version that brought what stmt uses; if so it checks that the server
// refuses stmt (so no such object can exist for outboxd to meet) instead of
// skipping the test.
func refusedBefore(t *testing.T, d *db, major int, stmt string) bool {
	t.Helper()
	v := serverMajor(t)
	if v >= major {
		return false
	}
	_, err := d.pool.Exec(context.Background(), stmt)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42601" {
		t.Fatalf("Postgres %d ran %s (%v); want a syntax error: it came in %d", v, stmt, err, major)
	}
	t.Logf("Postgres %d refuses %s (it came in %d), so there is nothing for outboxd to refuse", v, stmt, major)
	return true
}
