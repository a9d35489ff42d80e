// Command outboxbench is the load generator and stopwatch of the outboxd
// benchmark harness (bench/run). It fills the outbox, runs one contender
// (outboxd, Kafka Connect + Debezium, pg_recvlogical, or its own raw franz-go
// producer) against a workload, watches the contender's process and the
// Kafka topics, and prints one JSON result line per run on stdout.
//
// Subcommands:
//
//	setup    create the outbox table, a side table and the publication; drop stale bench slots
//	slot     (re)create a pgoutput slot
//	topics   create the run's topics (LogAppendTime, so Kafka stamps the append time); -warm
//	         writes past index.interval.bytes into each partition, so its first index entries come before the run
//	fill     write events into the outbox in one transaction or in T-row transactions
//	catchup  start a contender and time it until the expected records are in Kafka
//	produce  the raw Kafka limit: produce the same records with franz-go (acks=all, idempotent)
//	live     start a contender, write 1-row transactions at a fixed rate, measure commit → Kafka latency;
//	         -beside-rate runs produce -rate beside it and reports its latency (beside.go)
//	idle     start a contender, write only to another table, report slot lag
//	report   render a results directory without running anything: print the targets with
//	         PASS or FAIL, write report.md, results-<size>.md and gnuplot data, and with -docs
//	         rewrite the generated sections of BENCHMARKS.md and README.md
//	merge    assemble the cited run from full-size runs of some sections each (the last part
//	         naming a section gives it whole), then render it as report does
//	walread  read a slot to /dev/null, optionally with SO_RCVLOWAT; report the walsender's CPU
//	shards   read several slots of one fill in parallel, each through a row-filtered publication
//	copy     time a COPY … TO STDOUT read to nothing: the backfill's limit
//	replay   run outboxd replay until it exits, and check the records it sent
//	plan     run the benchmark plan (bench/run starts the services, then runs it): every section,
//	         workload and contender, each run as one of the subcommands above, then the report
//	unavailable  record that a contender could not be set up here, and why (a result line the report shows)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: outboxbench setup|slot|topics|fill|catchup|produce|live|idle|plan|report|merge|walread|shards|copy|replay|unavailable [flags]")
		os.Exit(2)
	}
	ctx := context.Background()
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "setup":
		err = cmdSetup(ctx, args)
	case "slot":
		err = cmdSlot(ctx, args)
	case "topics":
		err = cmdTopics(ctx, args)
	case "fill":
		err = cmdFill(ctx, args)
	case "tables":
		err = cmdTables(ctx, args)
	case "catchup":
		err = cmdCatchup(ctx, args)
	case "produce":
		err = cmdProduce(ctx, args)
	case "live":
		err = cmdLive(ctx, args)
	case "idle":
		err = cmdIdle(ctx, args)
	case "report":
		err = cmdReport(args)
	case "merge":
		err = cmdMerge(args)
	case "walread":
		err = cmdWalread(ctx, args)
	case "shards":
		err = cmdShards(ctx, args)
	case "copy":
		err = cmdCopy(ctx, args)
	case "replay":
		err = cmdReplay(ctx, args)
	case "plan":
		err = cmdPlan(ctx, args)
	case "unavailable":
		err = cmdUnavailable(args)
	default:
		err = fmt.Errorf("unknown subcommand %q", cmd)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "outboxbench %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

// common flags shared by most subcommands.
type common struct {
	dsn, brokers, prefix, slot, label, workload string
	types                                       int
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.dsn, "dsn", "postgres://postgres@127.0.0.1:55432/postgres?sslmode=disable", "Postgres DSN")
	fs.StringVar(&c.brokers, "brokers", "127.0.0.1:29092", "Kafka bootstrap broker")
	fs.StringVar(&c.prefix, "prefix", "bench", "aggregate type prefix: topics are <prefix>_t<k>-events")
	fs.StringVar(&c.slot, "slot", "bench", "replication slot")
	fs.StringVar(&c.label, "label", "", "contender label for the result line")
	fs.StringVar(&c.workload, "workload", "", "workload label for the result line")
	fs.IntVar(&c.types, "types", 10, "number of aggregate types (topics)")
}

func (c *common) topics() []string {
	t := make([]string, c.types)
	for i := range t {
		t[i] = fmt.Sprintf("%s_t%d-events", c.prefix, i)
	}
	return t
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s outboxbench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}
