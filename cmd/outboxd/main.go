// Command outboxd streams transactional-outbox events from a PostgreSQL
// logical replication slot to Kafka. Run "outboxd -h" for usage.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/debezium"
	"github.com/outboxd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/internal/httpserver"
	"github.com/outboxd/outboxd/internal/status"
	"github.com/outboxd/outboxd/relay"
)

// version and commit are stamped at build time with
// -ldflags "-X main.version=... -X main.commit=..."; without them (go
// install module@version) version is the module's.
var (
	version = "dev"
	commit  = ""
)

func init() {
	if version != "dev" {
		return
	}
	if bi, ok := debug.ReadBuildInfo(); ok && strings.HasPrefix(bi.Main.Version, "v") {
		version = bi.Main.Version
	}
}

func main() {
	defaultProcs(os.Getenv("GOMAXPROCS"), 1, runtimeProcs) // one shard until the configuration says more
	defaultGC(os.Getenv("GOGC"))
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		printError(os.Stderr, err)
		os.Exit(exitCode(err))
	}
}

// printError prints err, unless it was logged already, and then what to do
// about it (relay.Hint) on a line of its own.
func printError(w io.Writer, err error) {
	if !errors.Is(err, errReported) {
		fmt.Fprintf(w, "outboxd: %v\n", err)
	}
	if h := relay.Hint(err); h != "" {
		fmt.Fprintf(w, "hint: %s\n", h)
	}
}

// exitCode is 1 for an error, 2 for a wrong command line (as Go's flag
// package), status.ExitSlotGone for a missing or invalidated slot, which a
// restart must not "fix" by creating a new one.
func exitCode(err error) int {
	switch {
	case errors.Is(err, errUsage):
		return 2
	case relay.SlotGone(err):
		return status.ExitSlotGone
	}
	return 1
}

// errReported: the error was already logged.
var errReported = errors.New("reported")

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "debezium" {
		return debezium.Command(args[1:], os.Stdin, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "dlq" {
		return dlqCommand(args[1:], stdout, stderr)
	}
	inv, err := parseArgs(args, stderr)
	if err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	cmd := inv.cmd
	if cmd == "version" {
		fmt.Fprintf(stdout, "outboxd %s (commit %s, %s)\n", version, buildCommit(), runtime.Version())
		return nil
	}
	cfg, err := config.Load(inv.config, os.Environ())
	if err != nil {
		return err
	}
	if cmd == "reshard" && inv.to != 0 {
		cfg.Postgres.Shards = inv.to
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	defaultProcs(os.Getenv("GOMAXPROCS"), cfg.Postgres.Shards, runtimeProcs)
	if inv.check {
		out, _ := yaml.Marshal(cfg.Redacted())
		fmt.Fprintf(stdout, "configuration is valid\n%s", out)
		return nil
	}
	log := newLogger(cfg.Log, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	base := inv.url
	if base == "" && cfg.HTTP.Listen != "" {
		base = httpserver.LocalURL(cfg.HTTP.Listen, "")
	}
	switch cmd {
	case "migrate":
		return admin.Migrate(ctx, cfg, log)
	case "replay":
		return runReplay(ctx, cfg, inv.replay, log, stdout)
	case "reshard":
		s, err := relay.NewShards(cfg, log, prometheus.NewRegistry())
		if err != nil {
			return err
		}
		if err := s.Reshard(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "the slots of %q are those of %d shards\n", cfg.Postgres.Slot, cfg.Postgres.Shards)
		return nil
	case "healthcheck":
		if base == "" {
			return errors.New("http.listen is empty, so outboxd serves no /healthz to probe; set http.listen (or pass -url)")
		}
		hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		return httpserver.Probe(hctx, base+"/healthz")
	case "status":
		statusURL := ""
		if base != "" {
			statusURL = base + "/status"
		}
		rep, err := admin.BuildReport(ctx, cfg, statusURL)
		if err != nil {
			return err
		}
		if inv.asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(rep)
		}
		return rep.WriteText(stdout)
	}
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("outboxd stopped", "err", err, "slot", cfg.Postgres.Slot)
		return fmt.Errorf("%w: %w", errReported, err) // the cause decides the exit status
	}
	return nil
}

func serve(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	memLimit := defaultMemoryLimit(os.Getenv("GOMEMLIMIT"), cfg.Kafka)
	log.Info("starting", "version", version, "commit", buildCommit(), "gomaxprocs", runtime.GOMAXPROCS(0),
		"gogc", gcPercent(), "gomemlimit", memLimit)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	httpserver.RegisterBuildInfo(reg, version, buildCommit())
	r, err := relay.NewShards(cfg, log, reg)
	if err != nil {
		return err
	}
	// The endpoints answer from the start, so that a slow start-up check
	// (Kafka or Postgres not reachable yet) shows as not ready, with its
	// reason, rather than as no answer.
	g, gctx := errgroup.WithContext(ctx)
	// The pipeline ending (cleanly or not) ends the other components.
	runCtx, endAll := context.WithCancel(gctx)
	defer endAll()
	if cfg.HTTP.Listen != "" {
		srv, err := httpserver.Listen(cfg.HTTP.Listen, reg, func() (bool, status.Status) {
			ok, st := r.Ready()
			st.Version = version
			return ok, st
		}, cfg.HTTP.PProf)
		if err != nil {
			return err
		}
		log.Info("serving metrics and health", "addr", srv.Addr())
		g.Go(func() error { return srv.Run(runCtx) })
	}
	started, err := r.Start(ctx)
	if stopped, err := startUpEnded(ctx, err, log, cfg.Postgres.Slot); stopped || err != nil {
		endAll()
		_ = g.Wait()
		return err
	}
	g.Go(func() error { defer endAll(); return started.Run(runCtx) })
	return g.Wait()
}

// startUpEnded judges how the start-up checks ended (err). SIGTERM or
// SIGINT during them cancels ctx, and they then fail on the cancellation (a
// connection cut short, blamed on postgres.dsn): nothing was read yet, so
// that is a clean stop (stopped, exit 0), as one while streaming is, logged
// at Info with the error. Any other error is returned, even when a signal
// came too: a real start-up failure (Kafka SASL or TLS, wal_level, a
// reshard that stalls) must not exit 0.
func startUpEnded(ctx context.Context, err error, log *slog.Logger, slot string) (stopped bool, _ error) {
	if err == nil {
		return false, nil
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) && !relay.IsPermanent(err) {
		log.Info("stopped during the start-up checks", "slot", slot, "err", err)
		return true, nil
	}
	return false, err
}

func newLogger(cfg config.Log, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Level))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// buildCommit returns the stamped commit, else the VCS revision Go recorded.
func buildCommit() string {
	if commit != "" {
		return commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}
