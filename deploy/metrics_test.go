package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metricNames are the outboxd metrics the dashboard and the alerts may use,
// with their type. Renaming a metric in the code without renaming it here
// (and in the assets) must break this package's tests.
var metricNames = map[string]string{
	"outboxd_slot_lag_bytes":                                "gauge",
	"outboxd_slot_retained_wal_bytes":                       "gauge",
	"outboxd_slot_last_read_timestamp_seconds":              "gauge",
	"outboxd_slot_read_errors_total":                        "counter",
	"outboxd_slot_active":                                   "gauge",
	"outboxd_slot_active_pid":                               "gauge",
	"outboxd_slot_wal_status":                               "gauge",
	"outboxd_slot_safe_wal_size_bytes":                      "gauge",
	"outboxd_checkpoint_confirmed_lsn":                      "gauge",
	"outboxd_wal_received_lsn":                              "gauge",
	"outboxd_checkpoint_confirmed_commit_timestamp_seconds": "gauge",
	"outboxd_checkpoint_transactions_confirmed_total":       "counter",
	"outboxd_sink_records_produced_total":                   "counter",
	"outboxd_sink_produced_bytes_total":                     "counter",
	"outboxd_sink_produce_errors_total":                     "counter",
	"outboxd_sink_records_in_flight":                        "gauge",
	"outboxd_sink_buffer_fill_ratio":                        "gauge",
	"outboxd_sink_topics_created_total":                     "counter",
	"outboxd_router_dead_lettered_total":                    "counter",
	"outboxd_wal_changes_total":                             "counter",
	"outboxd_wal_transactions_total":                        "counter",
	"outboxd_relay_restarts_total":                          "counter",
	"outboxd_sink_commit_to_ack_seconds":                    "histogram",
	"outboxd_sink_batch_records":                            "histogram",
	"outboxd_wal_status_round_trip_seconds":                 "histogram",
	"outboxd_wal_commit_to_send_seconds":                    "histogram",
	"outboxd_relay_state":                                   "gauge",
	"outboxd_build_info":                                    "gauge",
	"outboxd_start_time_seconds":                            "gauge",
	"up":                                                    "gauge", // Prometheus' own, per target
}

// metricRef finds the metric names a PromQL expression (or a Grafana
// label_values query) refers to: outboxd_*, go_*, process_* and up.
var metricRef = regexp.MustCompile(`\b(outboxd_[a-z0-9_]+|go_[a-z0-9_]+|process_[a-z0-9_]+|up)\b`)

// runtimeNames gathers the names the Go and process collectors export, the
// ones cmd/outboxd registers.
func runtimeNames(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering runtime metrics: %v", err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
		if mf.GetType().String() == "HISTOGRAM" || mf.GetType().String() == "SUMMARY" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[mf.GetName()+s] = true
			}
		}
	}
	return names
}

// unknownMetrics returns the metric names expr uses that outboxd does not
// export. Label names and values that look like metric names (for example in
// `by (...)` clauses or string literals) are not metric references; none of
// ours do.
func unknownMetrics(expr string, runtime map[string]bool) []string {
	var bad []string
	for _, name := range metricRef.FindAllString(expr, -1) {
		if !knownMetric(name, runtime) && !slices.Contains(bad, name) {
			bad = append(bad, name)
		}
	}
	return bad
}

func knownMetric(name string, runtime map[string]bool) bool {
	if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
		return runtime[name]
	}
	if _, ok := metricNames[name]; ok {
		return true
	}
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, s); ok && metricNames[base] == "histogram" {
			return true
		}
	}
	return false
}

func TestMetricNamesFollowConventions(t *testing.T) {
	for name, kind := range metricNames {
		if name == "up" {
			continue
		}
		if !strings.HasPrefix(name, "outboxd_") {
			t.Errorf("%s: outboxd metrics start with outboxd_", name)
		}
		if (kind == "counter") != strings.HasSuffix(name, "_total") {
			t.Errorf("%s (%s): counters, and only counters, end in _total", name, kind)
		}
	}
}

func TestUnknownMetricsDetected(t *testing.T) {
	runtime := runtimeNames(t)
	for _, tc := range []struct {
		expr string
		bad  []string
	}{
		{`max by (job) (outboxd_slot_lag_bytes)`, nil},
		{`histogram_quantile(0.99, sum by (le) (rate(outboxd_sink_commit_to_ack_seconds_bucket[5m])))`, nil},
		{`rate(process_cpu_seconds_total[5m]) + go_goroutines`, nil},
		{`outboxd_slot_lag`, []string{"outboxd_slot_lag"}},
		{`outboxd_slot_lag_bytes_bucket`, []string{"outboxd_slot_lag_bytes_bucket"}},
		{`go_no_such_metric`, []string{"go_no_such_metric"}},
	} {
		if got := unknownMetrics(tc.expr, runtime); !slices.Equal(got, tc.bad) {
			t.Errorf("unknownMetrics(%q) = %v, want %v", tc.expr, got, tc.bad)
		}
	}
}

// TestMetricNamesInSource checks that every name in metricNames is still
// defined by outboxd's code (as the full string literal, which is how every
// package names its metrics), so renaming a metric in the code breaks this
// test until the dashboard, the rules and metricNames follow.
func TestMetricNamesInSource(t *testing.T) {
	literals := map[string]bool{}
	lit := regexp.MustCompile(`"(outboxd_[a-z0-9_]+)"`)
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "deploy" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAllStringSubmatch(string(src), -1) {
			literals[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range metricNames {
		if name != "up" && !literals[name] {
			t.Errorf("%s is in metricNames but no Go source defines it: renamed or removed? Update metricNames, grafana/outboxd.json and prometheus/alerts.yaml", name)
		}
	}
}
