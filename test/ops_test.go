package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// get returns the status code and body of an outboxd endpoint.
func (p *proc) get(path string) (int, string) {
	resp, err := http.Get("http://" + p.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitReady polls /readyz until it answers want.
func (p *proc) waitReady(want int, timeout time.Duration) string {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		code, body := p.get("/readyz")
		if code == want {
			return body
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("/readyz answered %d %s, want %d", code, body, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startPair starts two instances on one slot: a, streaming and ready, then
// b, its standby.
func startPair(t *testing.T, env []string) (a, b *proc) {
	t.Helper()
	a = start(t, env)
	a.waitStreaming()
	a.waitReady(200, 10*time.Second)
	b = start(t, env)
	m := listenRE.FindStringSubmatch(b.waitLog(`msg="serving metrics and health" addr=\S+`, 30*time.Second))
	b.addr = m[1]
	b.waitLog(`standby: another process holds the slot`, 30*time.Second)
	return a, b
}

// Two instances on one slot: one streams, the other is a standby that takes
// over within seconds when the active one is killed, with nothing lost and
// per-key order intact.
func TestHotStandbyTakesOverWhenTheActiveDies(t *testing.T) {
	d := newDB(t)
	a, b := startPair(t, d.env("OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=250ms"))
	body := b.waitReady(503, 10*time.Second)
	if !strings.Contains(body, `"state":"standby"`) {
		t.Errorf("standby /readyz body %s, want state standby", body)
	}
	if v, _ := b.metricLabelled(`outboxd_relay_state{state="standby"}`); v != 1 {
		t.Errorf(`standby outboxd_relay_state{state="standby"} = %v, want 1`, v)
	}
	if code, _ := b.get("/healthz"); code != 200 {
		t.Errorf("standby /healthz = %d, want 200 (it is alive)", code)
	}

	l := newLedger()
	spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 2, Events: 6000, TxSizes: []int{1, 10, 50}, RollbackPct: 5}
	loadDone := make(chan error, 1)
	go func() { loadDone <- runLoad(context.Background(), d, spec, l) }()
	waitCommitted(t, l, 2000)
	killed := time.Now()
	a.stop(syscall.SIGKILL, 10*time.Second)
	b.waitLog(`took over the slot`, 30*time.Second)
	b.waitReady(200, 30*time.Second)
	takeover := time.Since(killed)
	t.Logf("standby took over %s after the active instance was killed", takeover.Round(time.Millisecond))
	if takeover > 10*time.Second {
		t.Errorf("takeover took %s, want a few seconds", takeover)
	}
	verifyLoad(t, l, loadDone)
}

// A rolling restart: the active instance stops on SIGTERM, confirming what
// it delivered, and the standby takes over from there. The slot's confirmed
// position never moves back (the standby reads it only once the slot is
// released: connect refuses an active slot), and the standby delivers what
// comes next.
func TestStandbyTakesOverAfterAGracefulStop(t *testing.T) {
	d := newDB(t)
	a, b := startPair(t, d.env("OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=100ms"))

	typ := d.name + "_roll"
	var ids []string
	for range 20 {
		id, _ := insertEvent(t, d, typ, "k", `{}`)
		ids = append(ids, id)
	}
	readUntil(t, []string{typ + "-events"}, 30*time.Second, 0, waitIDs(ids...))
	if code := a.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("the active instance exited %d on SIGTERM", code)
	}
	handedOver := d.confirmedFlush(t)
	b.waitLog(`took over the slot`, 30*time.Second)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if got := d.confirmedFlush(t); got < handedOver {
			t.Fatalf("confirmed_flush_lsn moved back from %X to %X after the standby took over", handedOver, got)
		}
	}
	next, _ := insertEvent(t, d, typ, "k", `{}`)
	readUntil(t, []string{typ + "-events"}, 30*time.Second, 0, waitIDs(next))
}

// metricLabelled returns the value of one series, written as in the
// exposition: name{label="value",...}.
func (p *proc) metricLabelled(series string) (float64, bool) {
	p.t.Helper()
	name, labels := parseSeries(p.t, series)
	mfs, ok := p.scrape()
	if !ok {
		return 0, false
	}
	return seriesValue(mfs, name, labels)
}

// parseSeries splits name{a="x",b="y"} into the name and its labels.
func parseSeries(t *testing.T, series string) (string, map[string]string) {
	t.Helper()
	name, rest, ok := strings.Cut(series, "{")
	if !ok {
		return series, nil
	}
	labels := map[string]string{}
	for _, pair := range strings.Split(strings.TrimSuffix(rest, "}"), ",") {
		k, quoted, _ := strings.Cut(pair, "=")
		v, err := strconv.Unquote(quoted)
		if err != nil {
			t.Fatalf("series %s: label %s: %v", series, pair, err)
		}
		labels[k] = v
	}
	return name, labels
}

// The metrics operators and the shipped dashboard rely on are exported.
func TestMetricsAreExported(t *testing.T) {
	d := newDB(t)
	p := start(t, d.env())
	p.waitStreaming()
	id, _ := insertEvent(t, d, d.name+"_m", "k", `{}`)
	readUntil(t, []string{d.name + "_m-events"}, time.Minute, 0, waitIDs(id))
	time.Sleep(time.Second) // one status interval and slot-lag poll
	_, body := p.get("/metrics")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	for _, name := range []string{
		"outboxd_slot_lag_bytes", "outboxd_slot_retained_wal_bytes", "outboxd_slot_last_read_timestamp_seconds",
		"outboxd_slot_active", "outboxd_slot_active_pid", "outboxd_checkpoint_confirmed_lsn", "outboxd_wal_received_lsn",
		"outboxd_checkpoint_confirmed_commit_timestamp_seconds", "outboxd_checkpoint_transactions_confirmed_total",
		"outboxd_sink_produced_bytes_total", "outboxd_sink_records_in_flight", "outboxd_sink_buffer_fill_ratio",
		"outboxd_sink_commit_to_ack_seconds", "outboxd_sink_batch_records", "outboxd_wal_status_round_trip_seconds",
		"outboxd_wal_commit_to_send_seconds", "outboxd_wal_transactions_total", "outboxd_build_info",
		"outboxd_start_time_seconds", "go_goroutines", "process_resident_memory_bytes",
	} {
		if _, ok := mfs[name]; !ok {
			t.Errorf("/metrics has no %s", name)
		}
	}
	for series, want := range map[string]float64{
		"outboxd_slot_read_errors_total":                                       0,
		`outboxd_slot_wal_status{status="reserved"}`:                           1,
		`outboxd_sink_records_produced_total{topic="` + d.name + `_m-events"}`: 1,
		`outboxd_wal_changes_total{op="insert",table="public.outbox"}`:         1,
		"outboxd_relay_restarts_total":                                         0,
		`outboxd_router_dead_lettered_total{table="public.outbox"}`:            0,
		`outboxd_relay_state{state="streaming"}`:                               1,
	} {
		name, labels := parseSeries(t, series)
		if v, ok := seriesValue(mfs, name, labels); !ok || v != want {
			t.Errorf("/metrics: %s is %g (present: %t), want %g", series, v, ok, want)
		}
	}
	if !slices.ContainsFunc(slices.Collect(maps.Keys(mfs)), func(n string) bool { return strings.HasPrefix(n, "outboxd_kafka_") }) {
		t.Error("/metrics has no outboxd_kafka_* (franz-go's client metrics)")
	}
	if strings.Contains(body, d.dsn) {
		t.Error("/metrics contains the DSN")
	}
	// The event's transaction was timed from its commit to its sending.
	if n, _ := p.metricLabelled("outboxd_wal_commit_to_send_seconds_count"); n < 1 {
		t.Errorf("outboxd_wal_commit_to_send_seconds_count is %g, want at least 1 (the event's transaction)", n)
	}
	if sum, _ := p.metricLabelled("outboxd_wal_commit_to_send_seconds_sum"); sum <= 0 || sum > 60 {
		t.Errorf("outboxd_wal_commit_to_send_seconds_sum is %g s, want the few milliseconds Postgres took to send", sum)
	}
}

// JSON logs carry positions in Postgres' form (0/16B3748), as text logs,
// /status and Postgres itself do, not as the number slog would print.
func TestJSONLogsShowLSNsAsPostgresDoes(t *testing.T) {
	d := newDB(t)
	p := start(t, d.env("OUTBOXD_LOG_FORMAT=json"))
	line := p.waitLog(`\{[^\n]*"msg":"streaming"[^\n]*`, 30*time.Second)
	if !regexp.MustCompile(`"lsn":"[0-9A-F]+/[0-9A-F]+"`).MatchString(line) {
		t.Errorf("streaming line %s: want \"lsn\":\"<hi>/<lo>\"", line)
	}
	p.stop(syscall.SIGTERM, 30*time.Second)
	if line := regexp.MustCompile(`\{[^\n]*"msg":"stopped"[^\n]*`).FindString(p.logs.String()); !regexp.MustCompile(`"lsn":"[0-9A-F]+/[0-9A-F]+"`).MatchString(line) {
		t.Errorf("stopped line %q: want \"lsn\":\"<hi>/<lo>\"", line)
	}
}

// outboxd status shows the slot, its lag and the running process.
func TestStatusCommand(t *testing.T) {
	d := newDB(t)
	p := start(t, d.env())
	p.waitStreaming()
	env := replace(d.env(), "OUTBOXD_HTTP_LISTEN", p.addr)
	run := func(args ...string) string { return runStatus(t, env, args...) }
	text := run()
	t.Logf("outboxd status:\n%s", text)
	for _, want := range []string{"slot", d.slot + " (pgoutput), active, held by pid", "lag", "wal_status", "reserved",
		"publication", "outboxd: public.outbox", "outbox", "streaming since", "last error"} {
		if !strings.Contains(text, want) {
			t.Errorf("status output lacks %q", want)
		}
	}
	var rep struct {
		Slot      string `json:"slot"`
		Active    bool   `json:"active"`
		WALStatus string `json:"wal_status"`
		PubTables []string
		Process   *struct {
			State string `json:"state"`
		} `json:"outboxd"`
	}
	if err := json.Unmarshal([]byte(run("-json")), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Slot != d.slot || !rep.Active || rep.WALStatus != "reserved" || rep.Process == nil || rep.Process.State != "streaming" {
		t.Errorf("status -json = %+v", rep)
	}
	p.stop(syscall.SIGTERM, 30*time.Second)
	text = run()
	if !strings.Contains(text, "not reachable") || !strings.Contains(text, "inactive") {
		t.Errorf("status with outboxd stopped:\n%s", text)
	}
}

// A password in the DSN never appears in logs, errors, -check-config or
// status output, whether the connection works or fails.
func TestSecretsNeverAppearInOutput(t *testing.T) {
	d := newDB(t)
	const secret = "Sup3r-s3cret-pw"
	role := "pwrole_" + randomSuffix()
	d.exec(t, fmt.Sprintf(`CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'`, role, secret))
	d.exec(t, fmt.Sprintf(`GRANT SELECT ON outbox TO %s`, role))
	d.exec(t, `CREATE PUBLICATION outboxd FOR TABLE public.outbox`) // only the table's owner may
	t.Cleanup(func() {
		_, _ = d.pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %s; DROP ROLE IF EXISTS %s`, role, role))
	})
	dsn := strings.Replace(d.dsn, "postgres://postgres@", fmt.Sprintf("postgres://%s:%s@", role, secret), 1)
	wrong := strings.Replace(dsn, secret, secret+"-wrong", 1)
	unreachable := fmt.Sprintf("postgres://%s:%s@127.0.0.1:1/x?sslmode=disable", role, secret)
	kv := fmt.Sprintf("host=127.0.0.1 port=1 user=%s password=%s dbname=x sslmode=disable", role, secret)

	check := func(name, output string) {
		t.Helper()
		if strings.Contains(output, secret) {
			t.Errorf("%s: output contains the password:\n%s", name, output)
		}
	}
	runCmd := func(name string, env []string, args ...string) {
		cmd := exec.Command(svc.bin, args...)
		cmd.Env = env
		out, _ := cmd.CombinedOutput()
		check(name, string(out))
	}
	runCmd("check-config", replace(d.env(), "OUTBOXD_POSTGRES_DSN", dsn), "-check-config")
	runCmd("check-config key=value", replace(d.env(), "OUTBOXD_POSTGRES_DSN", kv), "-check-config")
	runCmd("invalid config", append(replace(d.env(), "OUTBOXD_POSTGRES_DSN", dsn), "OUTBOXD_KAFKA_LINGER=forever"), "-check-config")
	runCmd("wrong password", replace(d.env(), "OUTBOXD_POSTGRES_DSN", wrong))
	runCmd("unreachable", replace(d.env(), "OUTBOXD_POSTGRES_DSN", unreachable))
	runCmd("unreachable key=value", replace(d.env(), "OUTBOXD_POSTGRES_DSN", kv))
	runCmd("status unreachable", replace(d.env(), "OUTBOXD_POSTGRES_DSN", unreachable), "status")
	runCmd("migrate wrong password", replace(d.env(), "OUTBOXD_POSTGRES_DSN", wrong), "migrate")

	// A working run, with debug logging, that streams an event and stops.
	p := start(t, replace(d.env(), "OUTBOXD_POSTGRES_DSN", dsn))
	p.waitStreaming()
	id, _ := insertEvent(t, d, d.name+"_s", "k", `{}`)
	readUntil(t, []string{d.name + "_s-events"}, time.Minute, 0, waitIDs(id))
	_, metrics := p.get("/metrics")
	_, status := p.get("/status")
	runCmd("status", replace(d.env(), "OUTBOXD_POSTGRES_DSN", dsn), "status", "-url", "http://"+p.addr)
	p.stop(syscall.SIGTERM, 30*time.Second)
	check("streaming run log", p.logs.String())
	check("/metrics", metrics)
	check("/status", status)
}

// outboxd migrate makes the table with the columns the router reads, here
// the debezium preset's, and outboxd then streams from it; run again on
// the table it made, it changes nothing.
func TestMigrateMakesTheConfiguredTable(t *testing.T) {
	d := newDB(t)
	d.exec(t, `DROP TABLE outbox`)
	env := d.env("OUTBOXD_ROUTER_PRESET=debezium")
	for range 2 {
		migrate := exec.Command(svc.bin, "migrate")
		migrate.Env = env
		if out, err := migrate.CombinedOutput(); err != nil || strings.Contains(string(out), "migration skipped") {
			t.Fatalf("outboxd migrate with the debezium preset: %v\n%s", err, out)
		}
	}
	// Columns migrate does not make are named; two settings naming one
	// column are refused.
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"OUTBOXD_ROUTER_TIMESTAMP_COLUMN=occurred_at"}, `the router reads columns the table lacks.*columns=occurred_at`},
		{[]string{"OUTBOXD_ROUTER_ROUTE_BY_COLUMN=type"}, `router.event_type_column and router.route_by_column both name column type`},
	} {
		migrate := exec.Command(svc.bin, "migrate")
		migrate.Env = append(env[:len(env):len(env)], c.env...)
		out, _ := migrate.CombinedOutput()
		if !regexp.MustCompile(c.want).Match(out) {
			t.Errorf("outboxd migrate with %v: want %q in\n%s", c.env, c.want, out)
		}
	}

	// With key_encoding json_schema the key is JsonConverter's envelope,
	// whose schema is optional when the key column may be NULL.
	env = append(env, "OUTBOXD_ROUTER_KEY_ENCODING=json_schema")
	for _, optional := range []bool{false, true} {
		if optional {
			d.exec(t, `ALTER TABLE outbox ALTER COLUMN aggregateid DROP NOT NULL`)
		}
		p := start(t, env)
		p.waitStreaming()
		id := uuid()
		d.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k-1', 'Made', '{}')`, id, d.name+"_mig")
		want := fmt.Sprintf(`{"schema":{"type":"string","optional":%t},"payload":"k-1"}`, optional)
		if got := string(ids(readUntil(t, []string{d.name + "_mig-events"}, time.Minute, 0, waitIDs(id)))[id].Key); got != want {
			t.Errorf("key %s, want %s", got, want)
		}
		p.stop(syscall.SIGTERM, 30*time.Second)
	}
}
