// Package deploy holds outboxd's deployment and observability assets and the
// tests that keep them honest. It has no code that ships in the binary.
//
//   - grafana/outboxd.json: the dashboard (slot lag first).
//   - prometheus/alerts.yaml: alerting rules, with promtool unit tests in
//     prometheus/alerts_test.yaml; kubernetes/prometheusrule.yaml is the same
//     rules for the Prometheus operator, generated from alerts.yaml.
//   - outboxd.yaml: the example configuration used by compose.yaml and,
//     verbatim, by the Kubernetes ConfigMap.
//   - compose.yaml, kubernetes/, systemd/: ways to run it.
//
// The tests parse every manifest and check what they reference against the
// code: metric names, ports, probe paths, configuration keys (loaded with
// config.Load and validated). The alert tests need promtool (Debian package
// prometheus): without it they skip, except under CI, where they fail.
// No container engine runs on the development machine, so the Dockerfile and
// compose.yaml are checked by parsing only.
//
// With postgres.shards > 1 each shard's metrics carry slot="<its slot>". The
// rules about a slot or a pipeline aggregate by (namespace, job, slot), so
// they fire for the worst shard and name its slot; the dashboard draws one
// line per slot and has a $slot variable. Without shards the label is
// absent and both behave as before. The tests check both kinds of series.
//
// Callers' duties when changing outboxd:
//  1. Renaming or removing a metric: update metricNames in metrics_test.go,
//     then the dashboard and the rules the test then names.
//  2. Changing a configuration key: update outboxd.yaml and the ConfigMap.
//  3. Editing alerts.yaml: run go test ./deploy -run PrometheusRule -update to
//     regenerate kubernetes/prometheusrule.yaml, and keep docs/operations.md's
//     alert section in step (the test checks every runbook anchor exists).
package deploy
