// Package httpserver serves outboxd's operational HTTP endpoints: /metrics
// (Prometheus, from the registry main owns), /healthz (the process is
// alive), /readyz and /status (the relay's status.Status, as JSON), and,
// when enabled, Go's profiler under /debug/pprof/. It also registers the
// build-info metrics and probes a running outboxd's endpoints for
// `outboxd healthcheck`.
//
// The caller's duties:
//
//  1. Pass a ReadyFunc that is safe to call from the server's goroutines.
//  2. Call Run once, and cancel its context to shut the server down.
package httpserver
