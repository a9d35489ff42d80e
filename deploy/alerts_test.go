package deploy

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/sink"
)

var update = flag.Bool("update", false, "rewrite generated files (kubernetes/prometheusrule.yaml) instead of comparing")

type ruleFile struct {
	Groups []ruleGroup `yaml:"groups"`
}

type ruleGroup struct {
	Name  string `yaml:"name"`
	Rules []rule `yaml:"rules"`
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	var rf ruleFile
	readYAML(t, "prometheus/alerts.yaml", &rf)
	if len(rf.Groups) == 0 {
		t.Fatal("prometheus/alerts.yaml has no groups")
	}
	return rf
}

// readYAML decodes one YAML document strictly: unknown fields are errors.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// promtool returns the path of promtool. Without it the test skips, except
// under CI (CI set and non-empty), where a missing checker must not pass.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err == nil {
		return p
	}
	const how = "promtool is not installed; run scripts/testbed/promtool-fetch (make test does) and put the directory it prints on PATH, " +
		"or install Debian's prometheus package: apt-get install -y --no-install-recommends prometheus"
	if os.Getenv("CI") != "" {
		t.Fatal(how)
	}
	t.Skip(how)
	return ""
}

func runPromtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
}

func TestAlertRulesCheck(t *testing.T) {
	runPromtool(t, "prometheus", "check", "rules", "alerts.yaml")
}

// TestAlertRulesUnit runs alerts_test.yaml against alerts.yaml with the
// annotations cut down to summary (see the header of alerts_test.yaml).
func TestAlertRulesUnit(t *testing.T) {
	promtool(t)
	rf := loadRules(t)
	for gi := range rf.Groups {
		for ri := range rf.Groups[gi].Rules {
			r := &rf.Groups[gi].Rules[ri]
			r.Annotations = map[string]string{"summary": r.Annotations["summary"]}
		}
	}
	dir := t.TempDir()
	out, err := yaml.Marshal(rf)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("prometheus/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"alerts.yaml": out, "alerts_test.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runPromtool(t, dir, "test", "rules", "alerts_test.yaml")
}

// TestAlertRulesConventions checks what promtool does not: known metric
// names, one alert per deployment, severities, documented thresholds and a
// runbook section for every alert.
func TestAlertRulesConventions(t *testing.T) {
	rf := loadRules(t)
	runtime := runtimeNames(t)
	anchors := docAnchors(t)
	tested := testedAlerts(t)
	seen := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			t.Run(r.Alert, func(t *testing.T) {
				if r.Alert == "" {
					t.Fatalf("group %s has a rule without alert (recording rules belong elsewhere)", g.Name)
				}
				if seen[r.Alert] {
					t.Errorf("alert %s is defined twice", r.Alert)
				}
				seen[r.Alert] = true
				if bad := unknownMetrics(r.Expr, runtime); len(bad) > 0 {
					t.Errorf("expr uses metrics outboxd does not export: %v", bad)
				}
				if !strings.HasPrefix(r.Expr, "absent(") && !strings.Contains(r.Expr, "by (namespace, job") {
					t.Errorf("expr must aggregate by (namespace, job) so an HA pair alerts once: %s", r.Expr)
				}
				if s := r.Labels["severity"]; s != "warning" && s != "critical" {
					t.Errorf("severity %q: want warning or critical", s)
				}
				for _, k := range []string{"summary", "description", "threshold", "runbook_url"} {
					if r.Annotations[k] == "" {
						t.Errorf("annotation %s is missing", k)
					}
				}
				const base = "https://github.com/outboxd/outboxd/blob/main/docs/operations.md#"
				anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], base)
				if !ok {
					t.Errorf("runbook_url %q does not start with %s", r.Annotations["runbook_url"], base)
				} else if !anchors[anchor] {
					t.Errorf("runbook_url anchor #%s has no heading in docs/operations.md", anchor)
				}
				if !tested[r.Alert] {
					t.Errorf("no case in prometheus/alerts_test.yaml expects %s to fire", r.Alert)
				}
			})
		}
	}
}

// docAnchors returns the GitHub anchors of docs/operations.md's headings.
func docAnchors(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		anchors[strings.ReplaceAll(drop.ReplaceAllString(h, ""), " ", "-")] = true
	}
	return anchors
}

// testedAlerts returns the alerts that some case of alerts_test.yaml expects
// to fire.
func testedAlerts(t *testing.T) map[string]bool {
	t.Helper()
	var tf struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	data, err := os.ReadFile("prometheus/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &tf); err != nil {
		t.Fatalf("prometheus/alerts_test.yaml: %v", err)
	}
	out := map[string]bool{}
	for _, tc := range tf.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				out[a.Alertname] = true
			}
		}
	}
	return out
}

// TestPrometheusRuleInSync checks that the Prometheus operator's
// PrometheusRule carries exactly the rules of alerts.yaml; -update rewrites
// it from alerts.yaml.
func TestPrometheusRuleInSync(t *testing.T) {
	const path = "kubernetes/prometheusrule.yaml"
	rf := loadRules(t)
	if *update {
		var body bytes.Buffer
		enc := yaml.NewEncoder(&body)
		enc.SetIndent(2)
		if err := enc.Encode(map[string]any{"spec": rf}); err != nil {
			t.Fatal(err)
		}
		head := `# Generated from deploy/prometheus/alerts.yaml by
# go test ./deploy -run PrometheusRule -update. Do not edit: edit alerts.yaml.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: outboxd
  labels:
    app.kubernetes.io/name: outboxd
    app.kubernetes.io/component: relay
`
		if err := os.WriteFile(path, append([]byte(head), body.Bytes()...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var pr struct {
		APIVersion string         `yaml:"apiVersion"`
		Kind       string         `yaml:"kind"`
		Metadata   map[string]any `yaml:"metadata"`
		Spec       ruleFile       `yaml:"spec"`
	}
	readYAML(t, path, &pr)
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Errorf("%s is %s %s, want monitoring.coreos.com/v1 PrometheusRule", path, pr.APIVersion, pr.Kind)
	}
	if !reflect.DeepEqual(pr.Spec, rf) {
		t.Errorf("%s differs from prometheus/alerts.yaml; run go test ./deploy -run PrometheusRule -update", path)
	}
	var names []string
	for _, r := range pr.Spec.Groups[0].Rules {
		names = append(names, r.Alert)
	}
	if !slices.Contains(names, "OutboxdSlotRetainedWALHigh") {
		t.Errorf("%s lacks OutboxdSlotRetainedWALHigh", path)
	}
}

// TestLatencyBucketsFitAlert: histogram_quantile interpolates inside a
// bucket, so OutboxdEventLatencyHigh's threshold must be a bucket bound of
// outboxd_sink_commit_to_ack_seconds (else the alert fires for latencies
// well below it: with buckets 16.384 and 32.768, at about 17s for 30s), and
// the buckets must reach well past it.
func TestLatencyBucketsFitAlert(t *testing.T) {
	var threshold float64
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert != "OutboxdEventLatencyHigh" {
				continue
			}
			m := regexp.MustCompile(`outboxd_sink_commit_to_ack_seconds_bucket.*>\s*([0-9.]+)\s*$`).FindStringSubmatch(r.Expr)
			if m == nil {
				t.Fatalf("cannot find the threshold in %q", r.Expr)
			}
			threshold, _ = strconv.ParseFloat(m[1], 64)
		}
	}
	if threshold == 0 {
		t.Fatal("no OutboxdEventLatencyHigh rule")
	}
	reg := prometheus.NewRegistry()
	sink.NewMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var bounds []float64
	for _, mf := range mfs {
		if mf.GetName() == "outboxd_sink_commit_to_ack_seconds" {
			for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
				bounds = append(bounds, b.GetUpperBound())
			}
		}
	}
	if len(bounds) == 0 {
		t.Fatal("sink.NewMetrics registers no outboxd_sink_commit_to_ack_seconds")
	}
	t.Logf("buckets %v, alert threshold %gs", bounds, threshold)
	if !slices.Contains(bounds, threshold) {
		t.Errorf("the alert threshold %gs is not a bucket bound: p99 is interpolated across it", threshold)
	}
	if top := bounds[len(bounds)-1]; top < 4*threshold {
		t.Errorf("the highest bucket is %gs; want at least %gs to tell a slow pipeline from a stuck one", top, 4*threshold)
	}
	if bounds[0] > 0.001 {
		t.Errorf("the lowest bucket is %gs; want 1 ms or less (healthy latency is milliseconds)", bounds[0])
	}
	if len(bounds) > 20 {
		t.Errorf("%d buckets; keep it at 20 or fewer (each is a series)", len(bounds))
	}
}

// TestLastErrorWhereServed: /healthz answers {"status":"ok"} only (see
// httpserver.TestEndpoints); last_error is in /status and /readyz's body. The
// runbook and the alerts must send operators there.
func TestLastErrorWhereServed(t *testing.T) {
	wrong := regexp.MustCompile(`healthz[^.|\n]{0,80}last_error|last_error[^.|\n]{0,80}healthz`)
	for _, path := range []string{"../docs/operations.md", "prometheus/alerts.yaml"} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range wrong.FindAll(data, -1) {
			t.Errorf("%s: %q: /healthz has no last_error; it is in /status (and /readyz's body)", path, m)
		}
	}
}
