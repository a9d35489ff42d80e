package httpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxd/outboxd/internal/status"
)

// ReadyFunc reports whether the process is ready (streaming and making
// progress) and its status, which says why or why not.
type ReadyFunc func() (ready bool, st status.Status)

// Server serves the operational endpoints.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Listen binds addr and serves:
//
//	GET /metrics  Prometheus metrics from gatherer
//	GET /healthz  200 while the process runs (liveness)
//	GET /readyz   200 when ready, else 503; the body is ready's status as JSON (readiness)
//	GET /status   200 with ready's status as JSON (for `outboxd status`)
//
// With pprof, Go's profiler is served under /debug/pprof/ too.
func Listen(addr string, gatherer prometheus.Gatherer, ready ReadyFunc, pprof bool) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http.listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, body := ready()
		code := http.StatusOK
		if !ok {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, body)
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		_, body := ready()
		writeJSON(w, http.StatusOK, body)
	})
	if pprof {
		mux.HandleFunc("/debug/pprof/", httppprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", httppprof.Trace)
	}
	return &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln}, nil
}

func writeJSON(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// Addr returns the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Run serves until ctx is done.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := s.srv.Shutdown(sctx)
		if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		return err
	}
}

// RegisterBuildInfo registers outboxd_build_info and outboxd_start_time_seconds.
func RegisterBuildInfo(reg prometheus.Registerer, version, commit string) {
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "outboxd_build_info", Help: "Always 1; the labels say which build runs.",
	}, []string{"version", "commit", "goversion"})
	info.WithLabelValues(version, commit, runtime.Version()).Set(1)
	start := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "outboxd_start_time_seconds", Help: "When the process started (Unix seconds).",
	})
	start.SetToCurrentTime()
	reg.MustRegister(info, start)
}

// Probe GETs url and returns an error unless it answers 200 within ctx.
func Probe(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s: %s", url, resp.Status, body)
	}
	return nil
}

// LocalURL turns a listen address into a URL on this host: ":8080" and
// "0.0.0.0:8080" become "http://127.0.0.1:8080".
func LocalURL(listen, path string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "http://" + listen + path
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + path
}
