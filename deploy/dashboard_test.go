package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$job", ".*", "$instance", ".*")
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
