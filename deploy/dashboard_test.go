package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []struct {
			Name string `json:"name"`
			Expr string `json:"expr"`
		} `json:"list"`
	} `json:"annotations"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	GridPos    struct{ H, W, X, Y int }
	Targets    []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // collapsed rows
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile("grafana/outboxd.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("grafana/outboxd.json: %v", err)
	}
	return d
}

// flatten returns every panel, rows' children included.
func flatten(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, flatten(p.Panels)...)
	}
	return out
}

// queries returns every PromQL expression in the dashboard with where it is.
func (d dashboard) queries() map[string]string {
	q := map[string]string{}
	for _, p := range flatten(d.Panels) {
		for _, tg := range p.Targets {
			q[fmt.Sprintf("panel %q target %s", p.Title, tg.RefID)] = tg.Expr
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		switch q2 := v.Query.(type) {
		case string:
			q["variable "+v.Name] = q2
		case map[string]any:
			s, _ := q2["query"].(string)
			q["variable "+v.Name] = s
		}
	}
	for _, a := range d.Annotations.List {
		if a.Expr != "" {
			q["annotation "+a.Name] = a.Expr
		}
	}
	return q
}

func TestDashboardMetricsExist(t *testing.T) {
	d := loadDashboard(t)
	runtime := runtimeNames(t)
	used := map[string]bool{}
	for where, expr := range d.queries() {
		if strings.TrimSpace(expr) == "" {
			t.Errorf("%s: empty query", where)
		}
		if bad := unknownMetrics(expr, runtime); len(bad) > 0 {
			t.Errorf("%s uses metrics outboxd does not export: %v\n  %s", where, bad, expr)
		}
		for _, m := range metricRef.FindAllString(expr, -1) {
			used[m] = true
		}
	}
	// What issue 6 asks the dashboard to show.
	for _, m := range []string{
		"outboxd_slot_lag_bytes", "outboxd_checkpoint_confirmed_commit_timestamp_seconds",
		"outboxd_slot_wal_status", "outboxd_sink_records_produced_total", "outboxd_sink_produce_errors_total",
		"outboxd_router_dead_lettered_total", "outboxd_sink_records_in_flight", "outboxd_sink_buffer_fill_ratio",
		"outboxd_sink_commit_to_ack_seconds_bucket", "outboxd_relay_restarts_total", "outboxd_relay_state",
		"process_resident_memory_bytes", "process_cpu_seconds_total",
	} {
		if !used[m] {
			t.Errorf("the dashboard shows no %s", m)
		}
	}
}

func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both must be set (provisioning keys on uid)", d.UID, d.Title)
	}
	ps := flatten(d.Panels)
	ids := map[int]bool{}
	var first *panel
	for i, p := range ps {
		if ids[p.ID] {
			t.Errorf("panel %q: duplicate id %d", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.GridPos.W == 0 || p.GridPos.H == 0 {
			t.Errorf("panel %q has no size", p.Title)
		}
		var ds struct{ UID string }
		if err := json.Unmarshal(p.Datasource, &ds); err != nil || ds.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %s, want uid ${datasource} (the dashboard's variable)", p.Title, p.Datasource)
		}
		if first == nil || p.GridPos.Y < first.GridPos.Y || p.GridPos.Y == first.GridPos.Y && p.GridPos.X < first.GridPos.X {
			first = &ps[i]
		}
	}
	if first == nil || len(first.Targets) == 0 || !strings.Contains(first.Targets[0].Expr, "outboxd_slot_lag_bytes") {
		t.Errorf("the top-left panel must be slot lag bytes, is %+v", first)
	}
	var latency []string
	for _, expr := range d.queries() {
		if strings.Contains(expr, "outboxd_sink_commit_to_ack_seconds_bucket") {
			latency = append(latency, expr)
		}
	}
	for _, q := range []string{"histogram_quantile(0.5,", "histogram_quantile(0.99,"} {
		if !slices.ContainsFunc(latency, func(e string) bool { return strings.Contains(e, q) }) {
			t.Errorf("no commit-to-ack latency panel computes %s...)", q)
		}
	}
}

// TestDashboardQueriesParse has promtool parse every panel query, written as
// recording rules with Grafana's variables replaced.
func TestDashboardQueriesParse(t *testing.T) {
	promtool(t)
	d := loadDashboard(t)
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$job", ".*", "$instance", ".*", "$slot", ".*")
	var rules []map[string]string
	for where, expr := range d.queries() {
		if strings.HasPrefix(expr, "label_values(") {
			continue
		}
		name := "dashboard:" + strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
				return r
			}
			return '_'
		}, where)
		rules = append(rules, map[string]string{"record": name, "expr": vars.Replace(expr)})
	}
	slices.SortFunc(rules, func(a, b map[string]string) int { return strings.Compare(a["record"], b["record"]) })
	out, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.yaml"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, dir, "check", "rules", "dashboard.yaml")
}

// counterFunc finds rate(), irate() and increase() and what they are applied
// to: a metric name, or "" when the argument starts otherwise (a subquery).
var counterFunc = regexp.MustCompile(`\b(rate|irate|increase)\s*\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)?`)

// nonCounterRates returns the rate/irate/increase calls in expr applied to
// something that is not a counter: a counter's name ends in _total, or it is
// a histogram's _bucket, _sum or _count. On a gauge (an LSN, a timestamp)
// these functions read every decrease as a counter reset and every jump from
// 0 (a standby taking over) as an increase of the whole value.
func nonCounterRates(expr string) []string {
	var bad []string
	for _, m := range counterFunc.FindAllStringSubmatch(expr, -1) {
		name := m[2]
		ok := false
		for _, s := range []string{"_total", "_bucket", "_sum", "_count"} {
			ok = ok || strings.HasSuffix(name, s)
		}
		if !ok {
			bad = append(bad, m[0])
		}
	}
	return bad
}

func TestNonCounterRatesDetected(t *testing.T) {
	for _, tc := range []struct {
		expr string
		bad  int
	}{
		{`sum(rate(outboxd_sink_records_produced_total{job=~"$job"}[5m]))`, 0},
		{`histogram_quantile(0.99, sum by (le) (rate(outboxd_sink_commit_to_ack_seconds_bucket[5m])))`, 0},
		{`rate(outboxd_sink_commit_to_ack_seconds_sum[5m]) / rate(outboxd_sink_commit_to_ack_seconds_count[5m])`, 0},
		{`increase(outboxd_relay_restarts_total[15m])`, 0},
		{`max by (job) (rate(outboxd_checkpoint_confirmed_lsn{job=~"$job"}[5m]))`, 1},
		{`increase(outboxd_wal_received_lsn[5m])`, 1},
		{`irate(outboxd_start_time_seconds[5m])`, 1},
		{`rate((max(outboxd_checkpoint_confirmed_lsn))[5m:])`, 1},
		{`deriv(outboxd_checkpoint_confirmed_lsn[5m])`, 0},
	} {
		if got := nonCounterRates(tc.expr); len(got) != tc.bad {
			t.Errorf("nonCounterRates(%q) = %q, want %d", tc.expr, got, tc.bad)
		}
	}
}

// TestRatesOnlyOnCounters: the dashboard and the alert rules apply rate(),
// irate() and increase() to counters only.
func TestRatesOnlyOnCounters(t *testing.T) {
	for where, expr := range loadDashboard(t).queries() {
		if bad := nonCounterRates(expr); len(bad) > 0 {
			t.Errorf("%s applies %v to a metric that is not a counter; use deriv() or delta() on gauges\n  %s", where, bad, expr)
		}
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if bad := nonCounterRates(r.Expr); len(bad) > 0 {
				t.Errorf("alert %s applies %v to a metric that is not a counter\n  %s", r.Alert, bad, r.Expr)
			}
		}
	}
}

// TestDashboardConfirmedRateTakeover evaluates the confirmed-LSN throughput
// query with promtool over a failover: instance a streams and dies at minute
// 10; standby b, which reported 0, takes over at the slot's position (50 GB)
// and advances 1 MB a minute. The throughput must stay 1 MB/min throughout,
// not show the 50 GB jump.
func TestDashboardConfirmedRateTakeover(t *testing.T) {
	promtool(t)
	var expr string
	for where, q := range loadDashboard(t).queries() {
		if strings.Contains(where, "Received vs confirmed WAL") && !strings.Contains(q, "outboxd_wal_received_lsn") {
			expr = q
		}
	}
	if expr == "" {
		t.Fatal("no confirmed-LSN throughput query in panel \"Received vs confirmed WAL\"")
	}
	expr = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$job", ".*", "$instance", ".*", "$slot", ".*").Replace(expr)
	test := map[string]any{
		"rule_files":          []string{},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval": "1m",
			"input_series": []map[string]string{
				{"series": `outboxd_checkpoint_confirmed_lsn{job="outboxd",instance="a"}`, "values": "49990000000+1000000x10"},
				{"series": `outboxd_checkpoint_confirmed_lsn{job="outboxd",instance="b"}`, "values": "0x10 50000000000+1000000x20"},
			},
			"promql_expr_test": []map[string]any{
				{"expr": expr, "eval_time": "8m", "exp_samples": []map[string]any{{"labels": `{job="outboxd"}`, "value": 1e6 / 60}}},
				{"expr": expr, "eval_time": "13m", "exp_samples": []map[string]any{{"labels": `{job="outboxd"}`, "value": 1e6 / 60}}},
				{"expr": expr, "eval_time": "20m", "exp_samples": []map[string]any{{"labels": `{job="outboxd"}`, "value": 1e6 / 60}}},
			},
		}},
	}
	promtoolTest(t, test)
}

// perSlotMetric finds the metrics each shard exports with its own slot
// label whose panels must keep the shards apart: the slot's, the
// checkpoint's, the relay's state and the sink's backlog.
var perSlotMetric = regexp.MustCompile(`\boutboxd_(slot_[a-z_]+|checkpoint_confirmed_[a-z_]+|relay_state|sink_records_in_flight|sink_buffer_fill_ratio|wal_received_lsn)\b`)

// aggregation finds sum/max/min/avg/count with their by clause, if any.
var aggregation = regexp.MustCompile(`\b(sum|max|min|avg|count)\s*(?:by\s*\(([^)]*)\))?\s*\(`)

// TestDashboardKeepsSlotsApart: with postgres.shards > 1 every shard's
// metrics carry slot="<its slot>", and a panel that took the max of the
// shards' states or positions would hide the worst one. Every aggregation
// in a query of a per-shard metric keeps the slot label, and filters by the
// dashboard's $slot variable.
func TestDashboardKeepsSlotsApart(t *testing.T) {
	for where, expr := range loadDashboard(t).queries() {
		if strings.HasPrefix(expr, "label_values(") || !perSlotMetric.MatchString(expr) {
			continue
		}
		for _, m := range aggregation.FindAllStringSubmatch(expr, -1) {
			if !slices.Contains(strings.Fields(strings.ReplaceAll(m[2], ",", " ")), "slot") {
				t.Errorf("%s: %q drops the slot label (%s): %s", where, m[0], "one line per shard is what shows the worst", expr)
			}
		}
		if !strings.Contains(expr, `slot=~"$slot"`) {
			t.Errorf("%s: no slot=~\"$slot\" filter: %s", where, expr)
		}
	}
}

// TestDashboardLagPerSlot evaluates the top-left panel's lag query with
// promtool on the series of a sharded HA pair (instances a and b both
// report the two shards' slots) and of an unsharded deployment (no slot
// label): one line per slot, the worst shard's lag its own, and one line
// without shards.
func TestDashboardLagPerSlot(t *testing.T) {
	promtool(t)
	var expr string
	for where, q := range loadDashboard(t).queries() {
		if strings.Contains(where, "Slot lag and retained WAL") && strings.Contains(q, "outboxd_slot_lag_bytes") {
			expr = q
		}
	}
	if expr == "" {
		t.Fatal("no slot lag query in panel \"Slot lag and retained WAL\"")
	}
	expr = strings.NewReplacer("$job", ".*", "$slot", ".*").Replace(expr)
	test := map[string]any{
		"rule_files":          []string{},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval": "1m",
			"input_series": []map[string]string{
				{"series": `outboxd_slot_lag_bytes{job="orders",instance="a",slot="outboxd_0of2"}`, "values": "1000x10"},
				{"series": `outboxd_slot_lag_bytes{job="orders",instance="b",slot="outboxd_0of2"}`, "values": "1000x10"},
				{"series": `outboxd_slot_lag_bytes{job="orders",instance="a",slot="outboxd_1of2"}`, "values": "900000x10"},
				{"series": `outboxd_slot_lag_bytes{job="orders",instance="b",slot="outboxd_1of2"}`, "values": "900000x10"},
				{"series": `outboxd_slot_lag_bytes{job="billing",instance="c"}`, "values": "5000x10"},
			},
			"promql_expr_test": []map[string]any{
				{"expr": expr, "eval_time": "5m", "exp_samples": []map[string]any{
					{"labels": `{job="orders",slot="outboxd_0of2"}`, "value": 1000},
					{"labels": `{job="orders",slot="outboxd_1of2"}`, "value": 900000},
					{"labels": `{job="billing"}`, "value": 5000},
				}},
			},
		}},
	}
	promtoolTest(t, test)
}

// promtoolTest runs one promtool rule test file (no rule files: only its
// promql_expr_test cases).
func promtoolTest(t *testing.T, test map[string]any) {
	t.Helper()
	out, err := yaml.Marshal(test)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "expr_test.yaml"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, dir, "test", "rules", "expr_test.yaml")
}
