// Package metrics serves outboxd's operational HTTP endpoints: /metrics
// (Prometheus, from the registry main owns) and /healthz (the process is
// alive and its pipeline has not stopped for good).
package metrics
