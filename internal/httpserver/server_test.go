package httpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/internal/status"
)

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	RegisterBuildInfo(reg, "v1.2.3", "abc")
	ready := true
	st := status.Status{State: status.Streaming, LastError: "kafka: broker gone"}
	srv, err := Listen("127.0.0.1:0", reg, func() (bool, status.Status) {
		if ready {
			return true, st
		}
		return false, status.Status{State: status.Standby, Reason: "another process holds the slot", LastError: st.LastError}
	}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.ln.Close()
	h := srv.srv.Handler

	get := func(method, path string) (int, string, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec.Code, rec.Header().Get("Content-Type"), rec.Body.String()
	}
	asJSON := func(s string) map[string]any {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatalf("not a JSON object: %q: %v", s, err)
		}
		return m
	}

	// /healthz: liveness only. Its body is {"status":"ok"} and nothing else:
	// last_error is in /status and /readyz, not here.
	code, ctype, b := get(http.MethodGet, "/healthz")
	if code != http.StatusOK || ctype != "application/json" || !reflect.DeepEqual(asJSON(b), map[string]any{"status": "ok"}) {
		t.Errorf("/healthz: %d %s %q, want 200 application/json {\"status\":\"ok\"}", code, ctype, b)
	}

	for _, tc := range []struct {
		ready     bool
		path      string
		wantCode  int
		wantState string
	}{
		{true, "/readyz", http.StatusOK, "streaming"},
		{true, "/status", http.StatusOK, "streaming"},
		{false, "/readyz", http.StatusServiceUnavailable, "standby"},
		{false, "/status", http.StatusOK, "standby"}, // /status always answers 200
	} {
		ready = tc.ready
		code, ctype, b := get(http.MethodGet, tc.path)
		m := asJSON(b)
		if code != tc.wantCode || ctype != "application/json" || m["state"] != tc.wantState || m["last_error"] != st.LastError {
			t.Errorf("%s (ready %v): %d %s %q, want %d with state %s and last_error", tc.path, tc.ready, code, ctype, b, tc.wantCode, tc.wantState)
		}
		if _, ok := m["reason"]; ok == tc.ready {
			t.Errorf("%s (ready %v): reason present %v", tc.path, tc.ready, ok)
		}
	}

	code, ctype, b = get(http.MethodGet, "/metrics")
	if code != http.StatusOK || !strings.HasPrefix(ctype, "text/plain") || !strings.Contains(b, `outboxd_build_info{commit="abc",goversion=`) {
		t.Errorf("/metrics: %d %s, body lacks outboxd_build_info:\n%s", code, ctype, b)
	}

	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{http.MethodPost, "/healthz", http.StatusMethodNotAllowed},
		{http.MethodGet, "/debug/pprof/", http.StatusNotFound}, // pprof is off
		{http.MethodGet, "/nowhere", http.StatusNotFound},
	} {
		if code, _, _ := get(tc.method, tc.path); code != tc.want {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, code, tc.want)
		}
	}
}

func TestPprofAndProbe(t *testing.T) {
	srv, err := Listen("127.0.0.1:0", prometheus.NewRegistry(), func() (bool, status.Status) { return false, status.Status{State: status.Starting} }, true)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	base := LocalURL(srv.Addr(), "")
	// outboxd healthcheck probes /healthz: 200 even while not ready.
	if err := Probe(ctx, base+"/healthz"); err != nil {
		t.Errorf("Probe /healthz: %v", err)
	}
	if err := Probe(ctx, base+"/readyz"); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("Probe /readyz while starting: %v, want a 503 error", err)
	}
	if err := Probe(ctx, base+"/debug/pprof/"); err != nil {
		t.Errorf("Probe /debug/pprof/ with pprof on: %v", err)
	}
}

func TestLocalURL(t *testing.T) {
	for listen, want := range map[string]string{
		":8080":          "http://127.0.0.1:8080/healthz",
		"0.0.0.0:9090":   "http://127.0.0.1:9090/healthz",
		"[::]:8080":      "http://127.0.0.1:8080/healthz",
		"10.0.0.5:8080":  "http://10.0.0.5:8080/healthz",
		"localhost:8081": "http://localhost:8081/healthz",
	} {
		if got := LocalURL(listen, "/healthz"); got != want {
			t.Errorf("LocalURL(%q) = %q, want %q", listen, got, want)
		}
	}
}
