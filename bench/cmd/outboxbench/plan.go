package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The benchmark plan: which workloads run, which contenders run them and
// how each contender is started. bench/run builds the binaries, starts the
// harness's own Postgres and Kafka and then runs `outboxbench plan`, which
// runs every section in turn, each run as a subcommand of this same binary
// (catchup, live, idle, produce, shards) whose result line it appends to the
// run's results, and at the end renders the report.

// sections in the order a run without arguments takes them, ending with
// the takeover sections of issue 35 (about 3 minutes small, 12 full; a
// full run puts cost, which takes long, before them); deletes runs only
// when named.
var (
	takeoverSections  = []string{"backfill", "multitable", "replay"}
	defaultSections   = append([]string{"catchup", "sizes", "live", "idle", "shards"}, takeoverSections...)
	knownSections     = append(slices.Clone(defaultSections), "cost", "deletes")
	defaultContenders = []string{"pg_recvlogical", "pg_walread", "kafka_raw", "kafka_raw_eos", "outboxd", "outboxd_eos", "outboxd_s2", "outboxd_s4",
		"go_pq_cdc_kafka", "conduit", "debezium_default", "debezium_tuned"}
)

// sizeDefaults are the numbers of a size, before OUTBOXD_BENCH_* overrides.
type sizeDefaults struct {
	events, liveSeconds, idleSeconds, repeat, shardEvents int
	backfillRows                                          int
	sections                                              []string
}

var sizes = map[string]sizeDefaults{
	"small": {events: 50000, liveSeconds: 15, idleSeconds: 20, repeat: 1, shardEvents: 200000, backfillRows: 100000, sections: defaultSections},
	"full": {events: 1000000, liveSeconds: 30, idleSeconds: 60, repeat: 3, shardEvents: 1000000, backfillRows: 1000000,
		sections: slices.Insert(slices.Clone(defaultSections), len(defaultSections)-len(takeoverSections), "cost")},
}

// plan is one run of the harness: its settings and the paths bench/run
// prepared.
type plan struct {
	size                      string
	sections                  []string
	contenders                []string // as named; a peer that is not set up is left out
	n, liveS, idleS, shardN   int
	backfillN                 int // rows in the table before the backfill section's slot exists
	rates                     []float64
	besideRate                float64 // records/s of the bare producer beside each live run (OUTBOXD_BENCH_BESIDE_RATE; 0: none)
	liveRepeat, catchupRepeat int
	warmupS                   int
	dir, results, raw, root   string
	dsn, brokers, pgPort      string
	httpListen                string // outboxd's http.listen (OUTBOXD_BENCH_HTTP_PORT): harnesses side by side need their own
	ob                        string // this binary
	outboxd, outboxdB         string
	outboxdEnv, outboxdEnvB   string
	connectLibs, plugins      string
	gcOpts                    string
	costCurves                []string // the cost section's curves (OUTBOXD_BENCH_COST_CURVES)
	gopqcdc, conduit          string
	publish                   bool
	pgVersion                 int
	unsetBench                []string // env -u flags: outboxd rejects OUTBOXD_* variables that name no setting
}

func (p *plan) has(c string) bool { return slices.Contains(p.contenders, c) }

func (p *plan) log(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// envInt reads an OUTBOXD_BENCH_* override of a number.
func envInt(name string, def int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not a whole number", name, v)
	}
	return n, nil
}

// cmdPlan runs the plan: outboxbench plan [flags] small|full [SECTION...].
func cmdPlan(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("plan", flag.ExitOnError)
	var p plan
	fs.StringVar(&p.dir, "dir", "/tmp/outboxd-bench", "state directory: runs' logs and raw results")
	fs.StringVar(&p.pgPort, "pg-port", "55432", "the harness's Postgres port")
	kafkaPort := fs.String("kafka-port", "29092", "the harness's Kafka port")
	fs.StringVar(&p.outboxd, "outboxd", "", "outboxd binary")
	fs.StringVar(&p.outboxdB, "outboxd-b", "", "outboxd_b's binary (OUTBOXD_BENCH_REV_B); default: outboxd's")
	fs.StringVar(&p.connectLibs, "connect-libs", "", "Kafka Connect's classpath directory")
	fs.StringVar(&p.plugins, "plugins", "", "Debezium's plugin.path")
	fs.StringVar(&p.gcOpts, "gc-opts", "", "the JVM collector flags of Kafka Connect")
	fs.StringVar(&p.gopqcdc, "gopqcdc", "", "the go_pq_cdc_kafka peer's binary (bench/fetch-peers)")
	fs.StringVar(&p.conduit, "conduit", "", "the conduit peer's binary (bench/fetch-peers)")
	_ = fs.Parse(args)
	rest := fs.Args()
	p.size = "small"
	if len(rest) > 0 {
		p.size, rest = rest[0], rest[1:]
	}
	def, ok := sizes[p.size]
	if !ok {
		return fmt.Errorf("no size %q: small or full, then sections (%s)", p.size, strings.Join(knownSections, ", "))
	}
	p.sections = rest
	if len(p.sections) == 0 {
		p.sections = def.sections
	}
	for _, s := range p.sections {
		if !slices.Contains(knownSections, s) {
			return fmt.Errorf("no section %s (%s)", s, strings.Join(knownSections, ", "))
		}
	}
	var err error
	p.n, err = envInt("OUTBOXD_BENCH_EVENTS", def.events)
	if err == nil {
		p.liveS, err = envInt("OUTBOXD_BENCH_LIVE_SECONDS", def.liveSeconds)
	}
	if err == nil {
		p.shardN, err = envInt("OUTBOXD_BENCH_SHARD_EVENTS", def.shardEvents)
	}
	if err == nil {
		p.backfillN, err = envInt("OUTBOXD_BENCH_BACKFILL_ROWS", def.backfillRows)
	}
	if err == nil {
		p.liveRepeat, err = envInt("OUTBOXD_BENCH_LIVE_REPEAT", def.repeat)
	}
	if err == nil {
		p.catchupRepeat, err = envInt("OUTBOXD_BENCH_CATCHUP_REPEAT", def.repeat)
	}
	if err == nil {
		p.warmupS, err = envInt("OUTBOXD_BENCH_WARMUP_SECONDS", 20)
	}
	if err != nil {
		return err
	}
	p.idleS = def.idleSeconds
	rates := strings.Fields(os.Getenv("OUTBOXD_BENCH_RATES"))
	if len(rates) == 0 {
		rates = []string{"1000", "5000", "20000", "0"}
	}
	for _, r := range rates {
		v, err := strconv.ParseFloat(r, 64)
		if err != nil || v < 0 {
			return fmt.Errorf("OUTBOXD_BENCH_RATES: %q is not a rate in events/s (0: the writers' maximum)", r)
		}
		p.rates = append(p.rates, v)
	}
	if b := os.Getenv("OUTBOXD_BENCH_BESIDE_RATE"); b == "" {
		p.besideRate = 100
	} else if p.besideRate, err = strconv.ParseFloat(b, 64); err != nil || p.besideRate < 0 {
		return fmt.Errorf("OUTBOXD_BENCH_BESIDE_RATE: %q is not a rate in records/s (0: no producer beside the live runs)", b)
	}
	p.costCurves = strings.Fields(os.Getenv("OUTBOXD_BENCH_COST_CURVES"))
	for _, c := range p.costCurves {
		if !slices.Contains(costCurveNames, c) {
			return fmt.Errorf("OUTBOXD_BENCH_COST_CURVES: no curve %q (%s)", c, strings.Join(costCurveNames, ", "))
		}
	}
	if len(p.costCurves) == 0 {
		p.costCurves = costCurveNames
	}
	p.contenders = strings.Fields(os.Getenv("OUTBOXD_BENCH_CONTENDERS"))
	if len(p.contenders) == 0 {
		p.contenders = slices.Clone(defaultContenders)
	}
	// A peer without a binary could not be set up here: bench/run
	// recorded why, and it leaves the run.
	p.contenders = slices.DeleteFunc(p.contenders, func(c string) bool {
		return (c == "go_pq_cdc_kafka" && p.gopqcdc == "") || (c == "conduit" && p.conduit == "")
	})
	p.outboxdEnv, p.outboxdEnvB = os.Getenv("OUTBOXD_BENCH_OUTBOXD_ENV"), os.Getenv("OUTBOXD_BENCH_OUTBOXD_ENV_B")
	if p.outboxdB == "" {
		p.outboxdB = p.outboxd
	}
	if p.outboxd == "" {
		return errors.New("-outboxd is required")
	}
	p.results = os.Getenv("OUTBOXD_BENCH_RESULTS")
	if p.results == "" {
		p.results = filepath.Join(p.dir, "results")
	}
	// Only a complete full run, written where it is staged by default,
	// becomes the run the report cites.
	p.publish = p.size == "full" && slices.Equal(p.sections, def.sections) && os.Getenv("OUTBOXD_BENCH_CONTENDERS") == "" &&
		os.Getenv("OUTBOXD_BENCH_RESULTS") == "" &&
		os.Getenv("OUTBOXD_BENCH_EVENTS")+os.Getenv("OUTBOXD_BENCH_LIVE_SECONDS")+os.Getenv("OUTBOXD_BENCH_RATES")+
			os.Getenv("OUTBOXD_BENCH_SHARD_EVENTS")+os.Getenv("OUTBOXD_BENCH_BACKFILL_ROWS")+p.outboxdEnv == ""
	p.dsn = fmt.Sprintf("postgres://postgres@127.0.0.1:%s/postgres?sslmode=disable", p.pgPort)
	p.brokers = "127.0.0.1:" + *kafkaPort
	p.httpListen = "127.0.0.1:" + cmp.Or(os.Getenv("OUTBOXD_BENCH_HTTP_PORT"), "28080")
	p.raw = filepath.Join(p.dir, "results-"+p.size+".jsonl")
	if p.ob, err = os.Executable(); err != nil {
		return err
	}
	if p.root, err = os.Getwd(); err != nil {
		return err
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OUTBOXD_BENCH_") {
			p.unsetBench = append(p.unsetBench, "-u", k)
		}
	}
	return p.run(ctx)
}

// run runs the sections, then the report. The raw results file may
// already hold lines bench/run wrote (peers that could not be set up).
func (p *plan) run(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Join(p.dir, "runs"), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(p.results, 0o755); err != nil {
		return err
	}
	for _, pat := range []string{"results-*.jsonl", "results-*.md", "report.md", "*.dat", "*.png", "*.svg"} {
		old, _ := filepath.Glob(filepath.Join(p.results, pat))
		for _, f := range old {
			_ = os.Remove(f)
		}
	}
	if err := p.sub(ctx, io.Discard, "setup", "-dsn", p.dsn); err != nil {
		return err
	}
	// Every contender reads the publication outboxd would create
	// (wal.PublishActions), which also keeps the harness's TRUNCATE
	// between workloads out of the stream.
	if err := p.sql(ctx, "ALTER PUBLICATION bench SET (publish = 'insert, update')"); err != nil {
		return err
	}
	v, err := p.query(ctx, "SHOW server_version_num")
	if err != nil {
		return err
	}
	p.pgVersion, _ = strconv.Atoi(v)
	// The catch-up contenders: the sharded ones need row filters (Postgres 15+).
	var catchupAll []string
	for _, c := range p.contenders {
		if c == "kafka_raw_eos" {
			continue // a live floor only
		}
		if shardCount(c) != 0 && p.pgVersion < 150000 {
			p.log("%s: Postgres 15 or later needed for postgres.shards; skipped", c)
			continue
		}
		catchupAll = append(catchupAll, c)
	}
	if err := p.machine(ctx, catchupAll); err != nil {
		return err
	}

	// The broker's JIT compiles its produce path during its first minutes:
	// a first live run had a p99 of 1 s. Warm it up, unrecorded, before any
	// section (BENCHMARKS.md, "The harness").
	p.log("warming the broker up (%d s of paced produce, not recorded)", p.warmupS)
	p.topics(ctx, "warmup")
	if err := p.sub(ctx, io.Discard, "produce", "-dsn", p.dsn, "-brokers", p.brokers, "-prefix", "warmup", "-label", "warmup",
		"-workload", "warmup", "-rate", "20000", "-duration", fmt.Sprintf("%ds", p.warmupS)); err != nil {
		p.log("  warm-up failed")
	}
	p.untopics(ctx, "warmup")
	for _, section := range p.sections {
		switch section {
		case "catchup":
			p.catchupWorkload(ctx, workload{name: "catchup-100tx", n: p.n, tx: 100, size: 250}, catchupAll)
			p.catchupWorkload(ctx, workload{name: "catchup-1tx", n: p.n, tx: p.n, size: 250}, catchupAll)
		case "deletes":
			p.catchupWorkload(ctx, workload{name: "catchup-100tx-delete", n: p.n, tx: 100, size: 250, fillExtra: []string{"-delete"}}, catchupAll)
		case "sizes":
			p.catchupWorkload(ctx, workload{name: "catchup-100tx-4KB", n: p.n / 10, tx: 100, size: 4096}, catchupAll)
			p.catchupWorkload(ctx, workload{name: "catchup-100tx-64KB", n: p.n / 100, tx: 100, size: 65536}, catchupAll)
		case "cost":
			if !p.has("outboxd") {
				p.log("cost: measures outboxd, which is not among the contenders; skipped")
				break
			}
			for _, w := range costWorkloads(p.n) {
				curve, _, _ := costPoint(w.name)
				if !slices.Contains(p.costCurves, curve) {
					continue
				}
				cs := []string{"outboxd"}
				if curve == "topics" && p.has("kafka_raw") { // the broker's own cost of the topics
					cs = append(cs, "kafka_raw")
				}
				p.catchupWorkload(ctx, w, cs)
			}
		case "live":
			p.liveSection(ctx)
		case "idle":
			for _, c := range []string{"outboxd", "debezium_default"} {
				if p.has(c) {
					p.idleRun(ctx, c)
				}
			}
		case "backfill", "multitable", "replay":
			p.takeoverSection(ctx, section)
		case "shards":
			switch {
			case p.pgVersion < 150000:
				p.log("shards: Postgres 15 or later needed for row filters; skipped")
			case p.has("pg_walread"):
				p.shardsSection(ctx)
			}
		}
	}
	return p.finish(ctx)
}

// finish renders the report from the run's results and, for the run the
// report cites, replaces bench/results/latest and the generated sections.
func (p *plan) finish(ctx context.Context) error {
	raw, err := os.ReadFile(p.raw)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(p.results, "results-"+p.size+".jsonl"), raw, 0o644); err != nil {
		return err
	}
	if err := appendFile(filepath.Join(p.results, "machine-"+p.size+".txt"), "load at end: "+loadavg()+"\n"); err != nil {
		return err
	}
	p.log("targets (medians of each contender's runs; %s/report.md):", p.results)
	if err := cmdReport([]string{"-out", p.results, "-plots"}); err != nil {
		return err
	}
	if !p.publish {
		p.log("done: %s/report.md (not published: only a full run of every section and contender replaces bench/results/latest)", p.results)
		return nil
	}
	// The report cites this run: it replaces the previous one, whose data git keeps.
	latest := filepath.Join(p.root, "bench", "results", "latest")
	if err := os.RemoveAll(latest); err != nil {
		return err
	}
	if err := os.MkdirAll(latest, 0o755); err != nil {
		return err
	}
	files, _ := os.ReadDir(p.results)
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(p.results, f.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(latest, f.Name()), b, 0o644); err != nil {
			return err
		}
	}
	docs := filepath.Join(p.root, "BENCHMARKS.md") + "," + filepath.Join(p.root, "README.md")
	if err := p.sub(ctx, io.Discard, "report", "-out", latest, "-docs", docs); err != nil {
		return err
	}
	p.log("done: bench/results/latest replaced; BENCHMARKS.md and README.md regenerated from it")
	return nil
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	return errors.Join(err, f.Close())
}

// machine completes machine-<size>.txt, which bench/run started with what
// it built: the settings of the run and the versions.
func (p *plan) machine(ctx context.Context, catchupAll []string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "size: %s (catch-up events: %d)\n", p.size, p.n)
	if p.outboxdEnv != "" {
		fmt.Fprintf(&b, "outboxd environment: %s\n", p.outboxdEnv)
	}
	if p.outboxdEnvB != "" {
		fmt.Fprintf(&b, "outboxd_b environment: %s\n", p.outboxdEnvB)
	}
	for _, c := range catchupAll {
		if shardCount(c) != 0 {
			procs := fmt.Sprintf("outboxd's default, the shard count at most %d cores", runtime.NumCPU())
			if strings.Contains(" "+p.outboxdEnv+" ", " GOMAXPROCS=") {
				procs = "from the outboxd environment"
			}
			fmt.Fprintf(&b, "outboxd shards: outboxd_sN runs postgres.shards N; GOMAXPROCS %s\n", procs)
			break
		}
	}
	fmt.Fprintf(&b, "repeats: catch-up %d, live %d\n", p.catchupRepeat, p.liveRepeat)
	fmt.Fprintf(&b, "live floor beside each run: %g records/s\n", p.besideRate)
	v, err := p.query(ctx, "SHOW server_version")
	if err != nil {
		return err
	}
	fmt.Fprintf(&b, "postgres: %s\n", v)
	return appendFile(filepath.Join(p.results, "machine-"+p.size+".txt"), b.String())
}

// sub runs a subcommand of this binary, its result lines (stdout) to out
// and to the run's raw results when out is nil.
func (p *plan) sub(ctx context.Context, out io.Writer, args ...string) error {
	cmd := exec.CommandContext(ctx, p.ob, args...)
	cmd.Stderr = os.Stderr
	if out != nil {
		cmd.Stdout = out
		return cmd.Run()
	}
	raw, err := os.OpenFile(p.raw, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer raw.Close()
	cmd.Stdout = io.MultiWriter(os.Stdout, raw)
	return cmd.Run()
}

// result runs a contender's run as subcommand mode, adding the harness's
// Postgres and Kafka, and logs a failure with where its log is.
func (p *plan) result(ctx context.Context, c, logPath string, args ...string) {
	args = slices.Insert(args, 1, "-dsn", p.dsn, "-brokers", p.brokers)
	if err := p.sub(ctx, nil, args...); err != nil {
		if logPath != "" {
			p.log("  %s failed (see %s)", c, logPath)
		} else {
			p.log("  %s failed", c)
		}
	}
}

func (p *plan) sql(ctx context.Context, q string) error {
	conn, err := connect(ctx, p.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, q); err != nil {
		return fmt.Errorf("%s: %w", strings.Fields(q)[0], err)
	}
	return nil
}

func (p *plan) query(ctx context.Context, q string) (string, error) {
	conn, err := connect(ctx, p.dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, q).Scan(&v); err != nil {
		return "", fmt.Errorf("%s: %w", q, err)
	}
	return v, nil
}

// slot (re)creates a slot; with drop only drops it.
func (p *plan) slot(ctx context.Context, name string, drop bool) {
	args := []string{"slot", "-dsn", p.dsn, "-slot", name}
	if drop {
		args = append(args, "-drop")
	}
	if err := p.sub(ctx, io.Discard, args...); err != nil {
		p.log("  slot %s: %v", name, err)
	}
}

// topics creates a run's topics; extra are more flags of the topics
// subcommand (-types, -max-message-bytes).
func (p *plan) topics(ctx context.Context, prefix string, extra ...string) {
	if err := p.sub(ctx, io.Discard, append([]string{"topics", "-dsn", p.dsn, "-brokers", p.brokers, "-prefix", prefix}, extra...)...); err != nil {
		p.log("  creating topics %s* failed", prefix)
	}
}

// untopics deletes a run's topics, so that later runs meet a broker of the same size.
func (p *plan) untopics(ctx context.Context, prefix string, extra ...string) {
	if err := p.sub(ctx, io.Discard, append([]string{"topics", "-dsn", p.dsn, "-brokers", p.brokers, "-prefix", prefix, "-delete"}, extra...)...); err != nil {
		p.log("  deleting topics %s* failed", prefix)
	}
}

// quiesce writes out what the fill or the previous contender left dirty
// (the fill's WAL and pages, the previous run's Kafka log; fsync is off),
// so that the kernel does not write it back during the next contender's run.
func (p *plan) quiesce(ctx context.Context) {
	if err := p.sql(ctx, "CHECKPOINT"); err != nil {
		p.log("  %v", err)
	}
	_ = exec.Command("sync").Run()
	time.Sleep(time.Second)
}

var shardName = regexp.MustCompile(`^outboxd_s([0-9]+)$`)

// shardCount is N for outboxd_sN (postgres.shards: N), else 0.
func shardCount(c string) int {
	m := shardName.FindStringSubmatch(c)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// outboxdCmd is the command line of outboxd, outboxd_b, outboxd_eos or
// outboxd_sN on slot.
func (p *plan) outboxdCmd(c, slot string) []string {
	bin, extra := p.outboxd, p.outboxdEnv
	if c == "outboxd_b" {
		bin, extra = p.outboxdB, p.outboxdEnvB
	}
	// Exactly-once: everything else as outboxd's, the transaction settings at their defaults.
	if c == "outboxd_eos" {
		extra = "OUTBOXD_KAFKA_DELIVERY=exactly_once " + extra
	}
	// Sharded: everything else as outboxd's; the slot is the shards' base name.
	if n := shardCount(c); n != 0 {
		extra = fmt.Sprintf("OUTBOXD_POSTGRES_SHARDS=%d %s", n, extra)
	}
	// The takeover sections' outboxd: the backfill, the FOR ALL TABLES publication.
	extra = takeoverEnv(c) + extra
	argv := append([]string{"env"}, p.unsetBench...)
	argv = append(argv, "OUTBOXD_POSTGRES_DSN="+p.dsn, "OUTBOXD_POSTGRES_SLOT="+slot, "OUTBOXD_POSTGRES_PUBLICATION="+publicationOf(c),
		"OUTBOXD_KAFKA_BROKERS="+p.brokers, "OUTBOXD_KAFKA_TOPIC_PARTITIONS=6", "OUTBOXD_HTTP_LISTEN="+p.httpListen)
	argv = append(argv, strings.Fields(extra)...)
	return append(argv, bin)
}

// exactlyOnce tells whether a contender's command runs kafka.delivery: exactly_once.
func exactlyOnce(argv []string) bool {
	return slices.Contains(argv, "OUTBOXD_KAFKA_DELIVERY=exactly_once")
}

// connectCmd writes the worker and connector properties of Kafka Connect
// standalone + Debezium + EventRouter on slot, flavour default or tuned,
// and returns its command line.
func (p *plan) connectCmd(slot, flavour string) ([]string, error) {
	rd := filepath.Join(p.dir, "runs", "connect-"+slot+"-"+flavour)
	if err := os.RemoveAll(rd); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(rd, 0o755); err != nil {
		return nil, err
	}
	worker := fmt.Sprintf(`bootstrap.servers=%s
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
offset.storage.file.filename=%s/offsets
plugin.path=%s
listeners=http://127.0.0.1:28083
`, p.brokers, rd, p.plugins)
	connector := fmt.Sprintf(`name=bench-outbox
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
plugin.name=pgoutput
database.hostname=127.0.0.1
database.port=%s
database.user=postgres
database.password=unused
database.dbname=postgres
topic.prefix=bench
slot.name=%s
publication.name=bench
publication.autocreate.mode=disabled
table.include.list=public.outbox
snapshot.mode=no_data
tombstones.on.delete=false
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.table.field.event.key=aggregate_id
transforms.outbox.route.by.field=aggregate_type
transforms.outbox.route.topic.replacement=${routedByValue}-events
transforms.outbox.table.field.event.payload=payload
transforms.outbox.table.fields.additional.placement=event_type:header:eventType
`, p.pgPort, slot)
	if flavour == "tuned" {
		connector += "max.batch.size=16384\nmax.queue.size=65536\npoll.interval.ms=10\n"
		worker += "producer.linger.ms=5\nproducer.batch.size=262144\nproducer.enable.idempotence=true\nproducer.max.in.flight.requests.per.connection=5\n"
	}
	if err := errors.Join(os.WriteFile(filepath.Join(rd, "worker.properties"), []byte(worker), 0o644),
		os.WriteFile(filepath.Join(rd, "connector.properties"), []byte(connector), 0o644)); err != nil {
		return nil, err
	}
	// Heap and collector as in Kafka's connect-standalone.sh; full JIT.
	argv := append([]string{"java", "-Xms256m", "-Xmx2g"}, strings.Fields(p.gcOpts)...)
	return append(argv, "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile="+filepath.Join(p.root, "bench", "connect", "log4j2.properties"), "-Dbench.log.dir="+rd,
		"-cp", p.connectLibs+"/*", "org.apache.kafka.connect.cli.ConnectStandalone",
		filepath.Join(rd, "worker.properties"), filepath.Join(rd, "connector.properties")), nil
}

// peerCmd is the command line of a Go peer on slot.
//
// go_pq_cdc_kafka: bench/peers/gopqcdc's settings (its README's and
// production tutorial's: a 200 ms batch ticker, batches of 2,000 messages).
// conduit: one pipeline, the built-in Postgres source on the slot (logical
// replication, no snapshot) and the built-in Kafka destination, the topic
// taken from the row and the key set to aggregate_id by a field.set
// processor; values in Conduit's default OpenCDC JSON record, with the
// payload column (jsonb, which the source passes on as bytes, so base64 in
// the JSON) decoded by a json.decode processor, so that the value carries
// the event's JSON as go_pq_cdc_kafka's and outboxd's do and the delivery
// check can read its "seq"; acks=all. For throughput, its batching
// documentation: batches at the source (10,000 records or 5 ms), not at
// both ends, with the v2 pipeline architecture, which moves a source's
// batch through the pipeline as one unit; and no schema work (the records
// carry none), as Conduit's start-up warnings advise. Batching at the
// destination instead left v2 moving one record at a time, each waiting out
// the delay (105 events/s in a 20,000-event catch-up). The Postgres source
// hands on a batch when it holds sdk.batch.size records or on a ticker of
// 1 s (fixed in the connector), so below 10,000 events/s its live events
// wait for that ticker: its live figures are those of its throughput
// setting.
func (p *plan) peerCmd(c, slot string) ([]string, error) {
	switch c {
	case "go_pq_cdc_kafka":
		return []string{p.gopqcdc, "-host", "127.0.0.1", "-port", p.pgPort, "-slot", slot, "-publication", "bench",
			"-brokers", p.brokers, "-metrics-port", "28081"}, nil
	case "conduit":
		rd := filepath.Join(p.dir, "runs", c+"-"+slot)
		if err := os.RemoveAll(rd); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(rd, 0o755); err != nil {
			return nil, err
		}
		pipeline := fmt.Sprintf(`version: "2.2"
pipelines:
  - id: bench
    status: running
    connectors:
      - id: outbox
        type: source
        plugin: builtin:postgres
        settings:
          url: "%[1]s"
          tables: outbox
          cdcMode: logrepl
          snapshotMode: never
          logrepl.slotName: %[2]s
          logrepl.publicationName: bench
          logrepl.autoCleanup: "false"
          logrepl.withAvroSchema: "false"
          sdk.batch.size: "10000"
          sdk.batch.delay: 5ms
          sdk.schema.extract.key.enabled: "false"
          sdk.schema.extract.payload.enabled: "false"
      - id: kafka
        type: destination
        plugin: builtin:kafka
        settings:
          servers: %[3]s
          topic: '{{ printf "%%s-events" (index .Payload.After "aggregate_type") }}'
          acks: all
          compression: none
          sdk.schema.extract.key.enabled: "false"
          sdk.schema.extract.payload.enabled: "false"
    processors:
      - id: payload
        plugin: json.decode
        settings:
          field: .Payload.After.payload
%[4]s      - id: key
        plugin: field.set
        settings:
          field: .Key
          value: '{{ index .Payload.After "aggregate_id" }}'
%[4]s`, p.dsn, slot, p.brokers, noSchema)
		if err := os.WriteFile(filepath.Join(rd, "pipeline.yaml"), []byte(pipeline), 0o644); err != nil {
			return nil, err
		}
		return []string{"env", "-C", rd, p.conduit, "run", "--pipelines.path", filepath.Join(rd, "pipeline.yaml"),
			"--db.type", "badger", "--db.badger.path", filepath.Join(rd, "db"), "--api.enabled=false", "--log.level", "warn",
			"--connectors.path", filepath.Join(rd, "connectors"), "--processors.path", filepath.Join(rd, "processors"),
			"--pipelines.exit-on-degraded", "--preview.pipeline-arch-v2"}, nil
	}
	return nil, fmt.Errorf("no peer %s", c)
}

// noSchema turns off a Conduit processor's schema decoding and encoding:
// the records carry no schema (logrepl.withAvroSchema false), and Conduit
// warns at start that the processor should be told so.
const noSchema = `          sdk.schema.decode.key.enabled: "false"
          sdk.schema.decode.payload.enabled: "false"
          sdk.schema.encode.key.enabled: "false"
          sdk.schema.encode.payload.enabled: "false"
`

// shardPrepare makes the layout outboxd_sN streams, before the fill so
// that the fill is in its N slots. `outboxd reshard` makes the N
// publications <bench>_<i>of<N> as outboxd makes them (inserts only, the
// hashtext row filter, after its probe of the key column): with no slot of
// that base name in the database there is nothing to reshard (shard.Next
// answers Stream), so it only makes the publications and exits, and writes
// no row in the state table. Then the N slots <slot>_<i>of<N>, made as
// outboxd makes a missing slot (pg_create_logical_replication_slot,
// pgoutput). Started on them, outboxd finds the layout of postgres.shards
// and streams.
func (p *plan) shardPrepare(ctx context.Context, c, slot string) error {
	n := shardCount(c)
	logPath := filepath.Join(p.dir, "runs", slot+".reshard.log")
	f, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	argv := append(p.outboxdCmd(c, slot), "reshard", "-to", strconv.Itoa(n))
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("outboxd reshard -to %d failed (see %s)", n, logPath)
	}
	for i := range n {
		p.slot(ctx, fmt.Sprintf("%s_%dof%d", slot, i, n), false)
	}
	return nil
}

// shardDrop drops the N slots of shardPrepare.
func (p *plan) shardDrop(ctx context.Context, c, slot string) {
	n := shardCount(c)
	for i := range n {
		p.slot(ctx, fmt.Sprintf("%s_%dof%d", slot, i, n), true)
	}
}

// shardUnpublish drops the shard publications of the sharded contenders,
// and outboxd's reshard state table (a run that failed halfway through a
// reshard could leave a row), so that the next workload starts without them.
func (p *plan) shardUnpublish(ctx context.Context, contenders []string) {
	for _, c := range contenders {
		for i := range shardCount(c) {
			if err := p.sql(ctx, fmt.Sprintf("DROP PUBLICATION IF EXISTS bench_%dof%d", i, shardCount(c))); err != nil {
				p.log("  %v", err)
			}
		}
	}
	if err := p.sql(ctx, "DROP TABLE IF EXISTS public.outboxd_reshard"); err != nil {
		p.log("  %v", err)
	}
}

// catchupSlot is the slot of one catch-up run.
func catchupSlot(prefix, c string, rep int) string {
	if rep == 1 {
		return "bench_" + prefix + "_" + c
	}
	return fmt.Sprintf("bench_%s_%s_r%d", prefix, c, rep)
}

var notName = regexp.MustCompile(`[^a-z0-9]`)

// workload is one catch-up workload: its fill and what its runs add.
type workload struct {
	name          string
	n, tx, size   int
	types         int      // aggregate types, one topic each; 0: the default 10
	fillExtra     []string // more flags of fill
	maxMessage    int      // > 0: the topics' max.message.bytes and outboxd's kafka.max_message_bytes (the 1 MB events)
	outboxdEnvAdd string   // more of outboxd's environment (the cost section's settings)
	tables        int      // > 0: the events go over this many outbox tables of their own (postgres.tables), outboxd only
}

// tablesEnv is outboxd's environment for w's outbox tables: the list and
// their publication (messages name no table here).
func (w workload) tablesEnv(prefix string) string {
	if w.tables == 0 {
		return ""
	}
	return "OUTBOXD_POSTGRES_PUBLICATION=" + tablesPublication(prefix) + " OUTBOXD_POSTGRES_TABLES=" +
		strings.Join(outboxTables(prefix, w.tables), ",") + " OUTBOXD_ROUTER_MESSAGES_UNOWNED=ignore"
}

// topicFlags are the flags of the topics subcommand for w's topics.
func (w workload) topicFlags() []string {
	var f []string
	if w.types > 0 {
		f = append(f, "-types", strconv.Itoa(w.types))
	}
	if w.maxMessage > 0 {
		f = append(f, "-max-message-bytes", strconv.Itoa(w.maxMessage+w.maxMessage/10))
	}
	return f
}

// catchupWorkload fills the outbox once (every contender's slots made
// first) and lets each contender drain its own slot, catchupRepeat times.
func (p *plan) catchupWorkload(ctx context.Context, w workload, contenders []string) {
	prefix := notName.ReplaceAllString(w.name, "_")
	p.log("catch-up %s: %d events, %d rows/tx, %d B", w.name, w.n, w.tx, w.size)
	p.topics(ctx, prefix, w.topicFlags()...)
	if w.tables > 0 {
		if err := p.sub(ctx, io.Discard, "tables", "-dsn", p.dsn, "-prefix", prefix, "-n", strconv.Itoa(w.tables)); err != nil {
			p.log("  creating %d outbox tables failed: %v", w.tables, err)
			return
		}
		defer func() {
			if err := p.sub(ctx, io.Discard, "tables", "-dsn", p.dsn, "-prefix", prefix, "-n", strconv.Itoa(w.tables), "-drop"); err != nil {
				p.log("  dropping the outbox tables failed: %v", err)
			}
		}()
	}
	for rep := 1; rep <= p.catchupRepeat; rep++ { // every slot starts before the events
		for _, c := range contenders {
			if shardCount(c) != 0 {
				if err := p.shardPrepare(ctx, c, catchupSlot(prefix, c, rep)); err != nil {
					p.log("  %v", err) // its run then fails and says so
				}
			} else {
				p.slot(ctx, catchupSlot(prefix, c, rep), false)
			}
		}
	}
	var lsn strings.Builder
	args := []string{"fill", "-dsn", p.dsn, "-prefix", prefix, "-n", strconv.Itoa(w.n), "-tx", strconv.Itoa(w.tx), "-size", strconv.Itoa(w.size)}
	if w.types > 0 {
		args = append(args, "-types", strconv.Itoa(w.types))
	}
	if w.tables > 0 {
		args = append(args, "-tables", strconv.Itoa(w.tables))
	}
	if err := p.sub(ctx, &lsn, append(args, w.fillExtra...)...); err != nil {
		p.log("  fill failed: %v", err)
		return
	}
	endLSN := strings.TrimSpace(lsn.String())
	for rep := 1; rep <= p.catchupRepeat; rep++ {
		// Repeat r starts with the r-th contender, so that no contender
		// always runs first after the fill, or after the same neighbour.
		k := (rep - 1) % len(contenders)
		for _, c := range append(slices.Clone(contenders[k:]), contenders[:k]...) {
			p.quiesce(ctx)
			p.catchupRun(ctx, w, endLSN, c, catchupSlot(prefix, c, rep))
		}
	}
	p.untopics(ctx, prefix, w.topicFlags()...)
	p.shardUnpublish(ctx, contenders)
	if err := p.sql(ctx, "CHECKPOINT"); err != nil { // let Postgres recycle the WAL before the next workload
		p.log("  %v", err)
	}
}

// catchupRun lets one contender drain its slot.
func (p *plan) catchupRun(ctx context.Context, w workload, endLSN, c, slot string) {
	prefix := notName.ReplaceAllString(w.name, "_")
	n := w.n
	logPath := filepath.Join(p.dir, "runs", slot+".log")
	common := []string{"-slot", slot, "-prefix", prefix, "-label", c, "-workload", w.name, "-n", strconv.Itoa(n), "-size", strconv.Itoa(w.size),
		"-log", logPath, "-rss", filepath.Join(p.dir, "runs", slot+".rss")}
	if w.types > 0 {
		common = append(common, "-types", strconv.Itoa(w.types))
	}
	p.log("  %s", c)
	catchup := func(extra []string, argv []string) {
		args := append(append(append([]string{"catchup"}, common...), extra...), "--")
		p.result(ctx, c, logPath, append(args, argv...)...)
	}
	switch {
	case c == "pg_recvlogical" || c == "pg_recvlogical_alltables":
		catchup([]string{"-until-exit"}, []string{"pg_recvlogical", "-d", "host=127.0.0.1 port=" + p.pgPort + " user=postgres dbname=postgres",
			"-S", slot, "--start", "--no-loop", "-F", "0", "-o", "proto_version=1", "-o", "publication_names=" + publicationOf(c), "-E", endLSN, "-f", "/dev/null"})
	case c == "pg_walread": // the same decoding, read by a reader the kernel wakes per 32 KB
		catchup([]string{"-until-exit"}, []string{p.ob, "walread", "-dsn", p.dsn, "-slot", slot, "-end", endLSN, "-lowat", "32768"})
	case c == "kafka_raw":
		args := []string{"produce", "-prefix", prefix, "-label", c, "-workload", w.name, "-n", strconv.Itoa(n), "-size", strconv.Itoa(w.size)}
		if w.types > 0 {
			args = append(args, "-types", strconv.Itoa(w.types))
		}
		p.result(ctx, c, "", args...)
	case c == "outboxd" || c == "outboxd_b" || c == "outboxd_eos" || shardCount(c) != 0 || takeoverOutboxd(c):
		// outboxd_sN: -slot is the shards' base name (outboxbench reads the
		// worst shard's slot lag); timed until the last shard's last record.
		argv := p.outboxdCmd(c, slot)
		env := w.outboxdEnvAdd + " " + w.tablesEnv(prefix)
		if w.maxMessage > 0 {
			env += fmt.Sprintf(" OUTBOXD_KAFKA_MAX_MESSAGE_BYTES=%d", w.maxMessage)
		}
		argv = slices.Insert(argv, len(argv)-1, strings.Fields(env)...) // before the binary
		var extra []string
		if exactlyOnce(argv) { // timed as a read_committed consumer sees it
			extra = []string{"-read-committed"}
		}
		catchup(extra, argv)
	case c == "go_pq_cdc_kafka" || c == "conduit":
		argv, err := p.peerCmd(c, slot)
		if err != nil {
			p.log("  %s: %v", c, err)
			break
		}
		catchup(nil, argv)
	case strings.HasPrefix(c, "debezium_"):
		argv, err := p.connectCmd(slot, strings.TrimPrefix(c, "debezium_"))
		if err != nil {
			p.log("  %s: %v", c, err)
			break
		}
		catchup([]string{"-timeout", "30m"}, argv)
	default:
		p.log("  no contender %s", c)
	}
	p.slot(ctx, slot, true)
	p.shardDrop(ctx, c, slot)
}

// liveContenders are the contenders of the live section, in their order.
var liveContenders = []string{"outboxd", "outboxd_eos", "outboxd_b", "go_pq_cdc_kafka", "conduit", "debezium_default", "debezium_tuned"}

func (p *plan) liveSection(ctx context.Context) {
	// The generic warm-up sends records one at a time and reads none: the
	// first live run still met a broker whose JIT compilers were busy with
	// the paths of batched produce requests and of the measuring
	// consumer's fetches (4.1 CPU-s of C2 in its first 20 s, 0.25-0.43 s in
	// the next runs; it was the slowest run of its invocation in 4 of 5).
	// One live run of the first contender at the first rate, not recorded,
	// warms those paths for every contender.
	for _, c := range []string{"outboxd", "outboxd_b", "outboxd_eos", "debezium_tuned", "debezium_default"} {
		if p.has(c) {
			p.log("live warm-up: %s, not recorded", c)
			p.liveRun(ctx, c, p.rates[0], "warm", true)
			break
		}
	}
	for _, rate := range p.rates {
		for rep := 1; rep <= p.liveRepeat; rep++ { // repeats alternate, so drift hits every contender alike
			if rate != 0 && p.has("kafka_raw") {
				p.rawLatency(ctx, "kafka_raw", rate)
			}
			if rate != 0 && p.has("kafka_raw_eos") {
				p.rawLatency(ctx, "kafka_raw_eos", rate)
			}
			if rate != 0 && p.has("pg_walread") {
				p.liveRun(ctx, "pg_walread", rate, strconv.Itoa(rep), false)
			}
			for _, c := range liveContenders {
				if p.has(c) {
					p.liveRun(ctx, c, rate, strconv.Itoa(rep), false)
				}
			}
		}
	}
}

// liveRun is one live run of c at rate; an unrecorded one writes no
// result. A recorded run of a contender has a bare producer beside it (the
// floor in its own seconds; beside.go).
func (p *plan) liveRun(ctx context.Context, c string, rate float64, rep string, unrecorded bool) {
	var around liveAround
	if !unrecorded && slices.Contains(liveContenders, c) {
		around.probe = p.besideRate
	}
	p.liveRunWith(ctx, c, rate, rep, unrecorded, around)
}

// liveAround is what a live run of another section adds: its workload name
// (default live-250B), what is done after the table is emptied and before
// the slot is made (a fill the slot must not see), and a process run
// beside the contender (started with the run; the function it returns
// waits for it to end); and the rate of the bare producer the live command
// runs beside the contender (0: none).
type liveAround struct {
	workload string
	before   func(ctx context.Context)
	beside   func(ctx context.Context) (wait func())
	probe    float64
}

// liveRunWith is liveRun with what another section adds around it.
func (p *plan) liveRunWith(ctx context.Context, c string, rate float64, rep string, unrecorded bool, around liveAround) {
	workload := cmp.Or(around.workload, live250)
	r := fmt.Sprintf("%.0f", rate)
	writers := 8
	if rate == 0 || rate >= 20000 {
		writers = 16
	}
	prefix, slot := "live_"+c+"_"+r, "bench_live_"+c+"_"+r
	p.log("live %s at %s ev/s", c, rateLabel(rate))
	p.topics(ctx, prefix, "-warm")
	if err := p.sql(ctx, "TRUNCATE public.outbox"); err != nil { // every run starts from the same table size
		p.log("  %v", err)
	}
	if around.before != nil {
		around.before(ctx)
	}
	p.slot(ctx, slot, false)
	var argv, extra []string
	var err error
	switch {
	case c == "outboxd" || c == "outboxd_b" || c == "outboxd_eos":
		argv, extra = p.outboxdCmd(c, slot), []string{"-metrics", "http://" + p.httpListen + "/metrics"}
	case c == "go_pq_cdc_kafka" || c == "conduit":
		argv, err = p.peerCmd(c, slot)
	case strings.HasPrefix(c, "debezium_"):
		argv, err = p.connectCmd(slot, strings.TrimPrefix(c, "debezium_"))
	case c == "pg_walread": // Postgres' half alone: commit → receipt by a bare slot reader
		recv := filepath.Join(p.dir, "runs", slot+"-"+rep+".recv")
		argv, extra = []string{p.ob, "walread", "-dsn", p.dsn, "-slot", slot, "-received", recv}, []string{"-received", recv}
	}
	if err != nil {
		p.log("  %s: %v", c, err)
	} else {
		logPath := filepath.Join(p.dir, "runs", slot+".log")
		args := []string{"live", "-slot", slot, "-prefix", prefix, "-label", c, "-workload", workload, "-rate", r,
			"-writers", strconv.Itoa(writers)}
		args = append(args, extra...)
		if around.probe > 0 {
			p.topics(ctx, besidePrefix(prefix), "-types", "1", "-warm")
			defer p.untopics(ctx, besidePrefix(prefix), "-types", "1")
			args = append(args, "-beside-rate", strconv.FormatFloat(around.probe, 'f', -1, 64))
			if exactlyOnce(argv) {
				args = append(args, "-beside-txn")
			}
		}
		args = append(args, "-broker-pid-file", filepath.Join(p.dir, "kafka", "kafka.pid"), "-duration", fmt.Sprintf("%ds", p.liveS),
			"-log", logPath, "-rss", filepath.Join(p.dir, "runs", slot+".rss"),
			"-latencies", filepath.Join(p.dir, "runs", slot+"-"+rep+".lat"), "--")
		args = append(args, argv...)
		wait := func() {}
		if around.beside != nil {
			wait = around.beside(ctx)
		}
		if unrecorded {
			args = slices.Insert(args, 1, "-dsn", p.dsn, "-brokers", p.brokers)
			if err := p.sub(ctx, io.Discard, args...); err != nil {
				p.log("  %s failed (see %s)", c, logPath)
			}
		} else {
			p.result(ctx, c, logPath, args...)
		}
		wait()
	}
	p.slot(ctx, slot, true)
	p.untopics(ctx, prefix)
}

// rateLabel names a live rate in the log: events/s, or max.
func rateLabel(rate float64) string {
	if rate == 0 {
		return "max"
	}
	return fmt.Sprintf("%.0f", rate)
}

// rawLatency is the broker's own latency at rate, records sent one at a
// time by a plain franz-go producer while nothing else runs: for kafka_raw
// send → ack (the floor under the contenders' commit → append latency), for
// kafka_raw_eos send → commit in transactions committed back to back (the
// floor under outboxd_eos's).
func (p *plan) rawLatency(ctx context.Context, label string, rate float64) {
	r := fmt.Sprintf("%.0f", rate)
	prefix := "live_" + label + "_" + r
	what, args := "send → ack", []string{}
	if label == "kafka_raw_eos" {
		what, args = "send → commit, transactions back to back", []string{"-txn"}
	}
	p.log("live %s (%s) at %s ev/s", label, what, r)
	p.topics(ctx, prefix, "-warm")
	p.result(ctx, label, "", append([]string{"produce", "-prefix", prefix, "-label", label, "-workload", live250, "-rate", r,
		"-duration", fmt.Sprintf("%ds", p.liveS)}, args...)...)
	p.untopics(ctx, prefix)
}

// shardFilter is the row filter of shard i of n, as outboxd's
// postgres.shards writes it (shard.Filter): Postgres' hashtext of the key
// read as an unsigned 32-bit number, modulo n.
func shardFilter(n, i int) string {
	return fmt.Sprintf("mod(hashtext(aggregate_id)::bigint & 4294967295, %d) = %d", n, i)
}

// shardsSection: decoding only. One fill is read by 1 slot (no row
// filter), by 2 and by 4 slots in parallel whose publications split the
// aggregate ids with row filters, and by one slot of each share (all, a
// half, a quarter, none, all four filtered) alone, for the cost model of
// BENCHMARKS.md.
func (p *plan) shardsSection(ctx context.Context) {
	p.log("shards (decoding only): %d events, 100 rows/tx, 250 B", p.shardN)
	type pub struct{ name, where string }
	pubs := []pub{{"bench_shard_all", ""}, {"bench_shard_none", shardFilter(4, -1)}} // none: what a walsender spends whatever its filter takes
	for _, n := range []int{1, 2, 4} {
		for i := range n {
			pubs = append(pubs, pub{fmt.Sprintf("bench_shard_%d_%d", n, i), shardFilter(n, i)})
		}
	}
	for _, pb := range pubs {
		q := fmt.Sprintf("DROP PUBLICATION IF EXISTS %s; CREATE PUBLICATION %s FOR TABLE public.outbox", pb.name, pb.name)
		if pb.where != "" {
			q += " WHERE (" + pb.where + ")"
		}
		if err := p.sql(ctx, q+" WITH (publish = 'insert')"); err != nil {
			p.log("  %v", err)
		}
	}
	type shardRun struct {
		name  string
		pubs  []string
		share string
	}
	runs := []shardRun{
		{"shards-1", []string{"bench_shard_all"}, "1"},
		{"shards-2", []string{"bench_shard_2_0", "bench_shard_2_1"}, "0.5"},
		{"shards-4", []string{"bench_shard_4_0", "bench_shard_4_1", "bench_shard_4_2", "bench_shard_4_3"}, "0.25"},
		{"shard-alone-1/1", []string{"bench_shard_1_0"}, "1"},
		{"shard-alone-1/2", []string{"bench_shard_2_0"}, "0.5"},
		{"shard-alone-1/4", []string{"bench_shard_4_0"}, "0.25"},
		{"shard-alone-0", []string{"bench_shard_none"}, "0"},
	}
	// A repeat's runs take 11 slots, created before its fill: each repeat
	// has a fill of its own, so that max_replication_slots holds them.
	for rep := 1; rep <= p.catchupRepeat; rep++ {
		slots := map[string][]string{}
		for _, r := range runs { // each run: its slots (one per reader)
			for i := range r.pubs {
				s := fmt.Sprintf("bench_shards_%s_%d", notName.ReplaceAllString(r.name, "_"), i)
				p.slot(ctx, s, false)
				slots[r.name] = append(slots[r.name], s)
			}
		}
		var lsn strings.Builder
		if err := p.sub(ctx, &lsn, "fill", "-dsn", p.dsn, "-prefix", "shards", "-n", strconv.Itoa(p.shardN), "-tx", "100", "-size", "250"); err != nil {
			p.log("  fill failed: %v", err)
			continue
		}
		k := (rep - 1) % len(runs) // each repeat starts with the next run
		for _, r := range append(slices.Clone(runs[k:]), runs[:k]...) {
			p.quiesce(ctx)
			p.log("  %s", r.name)
			if err := p.sub(ctx, nil, "shards", "-dsn", p.dsn, "-label", "pg_walread", "-workload", r.name,
				"-slots", strings.Join(slots[r.name], ","), "-publications", strings.Join(r.pubs, ","), "-share", r.share,
				"-end", strings.TrimSpace(lsn.String()), "-n", strconv.Itoa(p.shardN), "-size", "250"); err != nil {
				p.log("  %s failed", r.name)
			}
			for _, s := range slots[r.name] {
				p.slot(ctx, s, true)
			}
		}
		if err := p.sql(ctx, "CHECKPOINT"); err != nil { // let Postgres recycle the fill's WAL
			p.log("  %v", err)
		}
	}
	for _, pb := range pubs {
		if err := p.sql(ctx, "DROP PUBLICATION "+pb.name); err != nil {
			p.log("  %v", err)
		}
	}
}

// idleRun holds c on a slot while another table is written.
func (p *plan) idleRun(ctx context.Context, c string) {
	slot := "bench_idle_" + c
	p.log("idle %s for %ds", c, p.idleS)
	p.slot(ctx, slot, false)
	var argv []string
	var err error
	if c == "outboxd" {
		argv = p.outboxdCmd(c, slot)
	} else {
		argv, err = p.connectCmd(slot, strings.TrimPrefix(c, "debezium_"))
	}
	if err != nil {
		p.log("  %s: %v", c, err)
	} else {
		logPath := filepath.Join(p.dir, "runs", slot+".log")
		p.result(ctx, c, logPath, append([]string{"idle", "-slot", slot, "-label", c, "-workload", "idle",
			"-duration", fmt.Sprintf("%ds", p.idleS), "-log", logPath, "--"}, argv...)...)
	}
	p.slot(ctx, slot, true)
}

// plots renders the PNGs of dir's data files with gnuplot, when it is there.
func plots(dir, size string) {
	if _, err := exec.LookPath("gnuplot"); err != nil {
		fmt.Fprintln(os.Stderr, "gnuplot not installed (apt-get install gnuplot-nox): no PNGs")
		return
	}
	has := func(name string) int {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return 0
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), `"`) {
				return 1
			}
		}
		return 0
	}
	// bench/run runs the tool from the repository's root.
	cmd := exec.Command("gnuplot", "-e", fmt.Sprintf("dir='%s'; size='%s'; hascatchup=%d; haslive=%d", dir, size, has("catchup.dat"), has("live.dat")),
		filepath.Join("bench", "plot.gp"))
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "gnuplot failed")
	}
}
