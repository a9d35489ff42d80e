// Command outboxd streams transactional-outbox events from a PostgreSQL
// logical replication slot to Kafka. Run "outboxd -h" for usage.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
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
	"github.com/outboxd/outboxd/metrics"
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

const usage = `Usage:
  outboxd [-config FILE] [-check-config]   stream the outbox to Kafka
  outboxd migrate [-config FILE]           create the outbox table
  outboxd status [-config FILE] [-json]    show the slot, its lag and the running outboxd
  outboxd reshard [-config FILE] [-to N]   change the shard count to N (default
                                           postgres.shards) and exit; stop the
                                           running outboxd first
  outboxd healthcheck [-config FILE] [-url URL]
                                           exit 0 if the running outboxd answers /healthz
  outboxd version                          print the version
  outboxd debezium convert FILE            convert a Debezium connector config

Settings come from defaults, then FILE (YAML), then OUTBOXD_* environment
variables (OUTBOXD_POSTGRES_DSN, OUTBOXD_KAFKA_BROKERS, ...).
`

func main() {
	defaultProcs(os.Getenv("GOMAXPROCS"), 1, runtimeProcs) // one shard until the configuration says more
	defaultGC(os.Getenv("GOGC"))
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, errReported) {
			fmt.Fprintf(os.Stderr, "outboxd: %v\n", err)
		}
		os.Exit(exitCode(err))
	}
}

// exitCode is 1 for an error, relay.ExitSlotGone for a missing or
// invalidated slot, which a restart must not "fix" by creating a new one.
func exitCode(err error) int {
	if relay.SlotGone(err) {
		return relay.ExitSlotGone
	}
	return 1
}

// errReported: the error was already logged.
var errReported = errors.New("reported")

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "debezium" {
		return debezium.Command(args[1:], os.Stdin, stdout, stderr)
	}
	cmd := "run"
	if len(args) > 0 {
		switch args[0] {
		case "migrate", "version", "status", "healthcheck", "reshard":
			cmd, args = args[0], args[1:]
		}
	}
	fs := flag.NewFlagSet("outboxd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	path := fs.String("config", "", "YAML configuration `file`")
	check := fs.Bool("check-config", false, "validate the configuration, print it with secrets hidden, and exit")
	asJSON := fs.Bool("json", false, "status: print JSON")
	to := fs.Int("to", 0, "reshard: the shard count to change to (default postgres.shards)")
	url := fs.String("url", "", "status, healthcheck: the running outboxd's base URL (default from http.listen)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errReported
	}
	if cmd == "version" {
		fmt.Fprintf(stdout, "outboxd %s (commit %s, %s)\n", version, buildCommit(), runtime.Version())
		return nil
	}
	cfg, err := config.Load(*path, os.Environ())
	if err != nil {
		return err
	}
	if cmd == "reshard" && *to != 0 {
		cfg.Postgres.Shards = *to
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	defaultProcs(os.Getenv("GOMAXPROCS"), cfg.Postgres.Shards, runtimeProcs)
	if *check {
		out, _ := yaml.Marshal(cfg.Redacted())
		fmt.Fprintf(stdout, "configuration is valid\n%s", out)
		return nil
	}
	log := newLogger(cfg.Log, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	base := *url
	if base == "" && cfg.HTTP.Listen != "" {
		base = metrics.LocalURL(cfg.HTTP.Listen, "")
	}
	switch cmd {
	case "migrate":
		return admin.Migrate(ctx, cfg, log)
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
		return metrics.Probe(hctx, base+"/healthz")
	case "status":
		statusURL := ""
		if base != "" {
			statusURL = base + "/status"
		}
		rep, err := admin.BuildReport(ctx, cfg, statusURL)
		if err != nil {
			return err
		}
		if *asJSON {
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
	metrics.RegisterBuildInfo(reg, version, buildCommit())
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
		srv, err := metrics.Listen(cfg.HTTP.Listen, reg, func() (bool, any) {
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
	if err := r.Start(ctx); err != nil {
		endAll()
		_ = g.Wait()
		return err
	}
	g.Go(func() error { defer endAll(); return r.Run(runCtx) })
	return g.Wait()
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
