package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/outboxd/outboxd/internal/replay"
)

// invocation is what the command line asks for: the subcommand ("run" when
// none is named) and its flags' values.
type invocation struct {
	cmd    string
	config string
	check  bool   // run: -check-config
	asJSON bool   // status: -json
	to     int    // reshard: -to
	url    string // status, healthcheck: -url
	replay replay.Options
}

// subcommand is one of outboxd's subcommands: its line of the usage and the
// flags it takes, and only those.
type subcommand struct {
	name  string
	usage string
	flags func(fs *flag.FlagSet, inv *invocation)
}

func configFlag(fs *flag.FlagSet, inv *invocation) {
	fs.StringVar(&inv.config, "config", "", "YAML configuration `file`")
}

func urlFlag(fs *flag.FlagSet, inv *invocation) {
	fs.StringVar(&inv.url, "url", "", "the running outboxd's base `URL` (default from http.listen)")
}

// subcommands are outboxd's subcommands; "run" is the one that runs when
// none is named. debezium is handed to package debezium as it is.
var subcommands = []subcommand{
	{"run", "outboxd [-config FILE] [-check-config]   stream the outbox to Kafka", func(fs *flag.FlagSet, inv *invocation) {
		configFlag(fs, inv)
		fs.BoolVar(&inv.check, "check-config", false, "validate the configuration, print it with secrets hidden, and exit")
	}},
	{"migrate", "outboxd migrate [-config FILE]           create the outbox table", configFlag},
	{"status", "outboxd status [-config FILE] [-json] [-url URL]\n                                           show the slot, its lag and the running outboxd", func(fs *flag.FlagSet, inv *invocation) {
		configFlag(fs, inv)
		fs.BoolVar(&inv.asJSON, "json", false, "print JSON")
		urlFlag(fs, inv)
	}},
	{"reshard", "outboxd reshard [-config FILE] [-to N]   change the shard count to N (default\n                                           postgres.shards) and exit; stop the\n                                           running outboxd first", func(fs *flag.FlagSet, inv *invocation) {
		configFlag(fs, inv)
		fs.IntVar(&inv.to, "to", 0, "the shard `count` to change to (default postgres.shards)")
	}},
	{"healthcheck", "outboxd healthcheck [-config FILE] [-url URL]\n                                           exit 0 if the running outboxd answers /healthz", func(fs *flag.FlagSet, inv *invocation) {
		configFlag(fs, inv)
		urlFlag(fs, inv)
	}},
	{"replay", replayUsage, replayFlags},
	{"version", "outboxd version                          print the version", func(*flag.FlagSet, *invocation) {}},
	{"debezium", "outboxd debezium convert FILE            convert a Debezium connector config", nil},
	{"dlq", "outboxd dlq list|redrive [-topic T] ...  show dead letters, or send them to their\n                                           intended topics ('outboxd dlq -h')", nil},
	{"help", "outboxd help [COMMAND]                   print this usage, or a command's flags", nil},
}

const usageTail = `
Settings come from defaults, then FILE (YAML), then OUTBOXD_* environment
variables (OUTBOXD_POSTGRES_DSN, OUTBOXD_KAFKA_BROKERS, ...).
`

// writeUsage writes the usage of every subcommand, and the flags of run.
func writeUsage(w io.Writer) {
	fs := flag.NewFlagSet("outboxd", flag.ContinueOnError)
	subcommands[0].flags(fs, &invocation{})
	subUsage(w, subcommands[0], fs)
}

// errUsage: the command line is wrong; the error and the usage were
// printed. outboxd exits 2, as Go's flag package does.
var errUsage = fmt.Errorf("%w: wrong arguments", errReported)

// errHelp: the usage was asked for and printed; outboxd exits 0.
var errHelp = errors.New("help printed")

// parseArgs reads the command line (without the program name): an optional
// subcommand, then that subcommand's flags, and nothing else. On a wrong
// command line it prints what is wrong and the usage to stderr and returns
// errUsage; on -h or help it prints the usage and returns errHelp.
func parseArgs(args []string, stderr io.Writer) (invocation, error) {
	sub := subcommands[0]
	var fs *flag.FlagSet
	bad := func(format string, a ...any) (invocation, error) {
		fmt.Fprintf(stderr, "outboxd: "+format+"\n\n", a...)
		if fs != nil && sub.name != "run" {
			subUsage(stderr, sub, fs) // the command's own usage and flags
		} else {
			writeUsage(stderr)
		}
		return invocation{}, errUsage
	}
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		s, ok := lookup(args[0])
		switch {
		case !ok:
			if near := closest(args[0]); near != "" {
				return bad("unknown command %q; did you mean %q?", args[0], near)
			}
			return bad("unknown command %q", args[0])
		case s.name == "help":
			return help(args[1:], stderr)
		}
		sub, args = s, args[1:]
	}
	inv := invocation{cmd: sub.name}
	name := "outboxd"
	if sub.name != "run" {
		name += " " + sub.name
	}
	fs = flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { subUsage(stderr, sub, fs) }
	sub.flags(fs, &inv)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return invocation{}, errHelp
		}
		return invocation{}, errUsage // the flag package printed the error and fs.Usage
	}
	if fs.NArg() > 0 {
		extra := fs.Arg(0)
		if s, ok := lookup(extra); ok && sub.name == "run" && s.name != "run" {
			return bad("unexpected argument %q: the command comes first, before its flags (outboxd %s -config FILE)", extra, extra)
		}
		return bad("unexpected argument %q: %s takes flags only", extra, name)
	}
	if sub.name == "reshard" {
		// -to 0 given explicitly is an error, not "postgres.shards" (the
		// flag's zero value, which only its absence means).
		given := false
		fs.Visit(func(f *flag.Flag) { given = given || f.Name == "to" })
		if inv.to < 0 || given && inv.to < 1 {
			return bad("reshard -to %d: the shard count is at least 1; leave -to out to reshard to postgres.shards", inv.to)
		}
	}
	return inv, nil
}

// help prints the usage, or one subcommand's with its flags.
func help(args []string, stderr io.Writer) (invocation, error) {
	if len(args) == 0 {
		writeUsage(stderr)
		return invocation{}, errHelp
	}
	s, ok := lookup(args[0])
	if !ok || len(args) > 1 {
		fmt.Fprintf(stderr, "outboxd help: unknown command %q\n\n", strings.Join(args, " "))
		writeUsage(stderr)
		return invocation{}, errUsage
	}
	fs := flag.NewFlagSet(s.name, flag.ContinueOnError)
	if s.flags != nil {
		s.flags(fs, &invocation{})
	}
	subUsage(stderr, s, fs)
	return invocation{}, errHelp
}

// subUsage prints one subcommand's usage line and its flags; for run, the
// one without a command, every subcommand's line.
func subUsage(w io.Writer, s subcommand, fs *flag.FlagSet) {
	if s.name == "run" {
		fmt.Fprintln(w, "Usage:")
		for _, s := range subcommands {
			fmt.Fprintf(w, "  %s\n", s.usage)
		}
	} else {
		fmt.Fprintf(w, "Usage:\n  %s\n", s.usage)
	}
	flags := 0
	fs.VisitAll(func(*flag.Flag) { flags++ })
	if flags > 0 {
		if s.name == "run" {
			fmt.Fprintln(w, "\nFlags without a command ('outboxd help COMMAND' lists a command's):")
		} else {
			fmt.Fprintln(w, "\nFlags:")
		}
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
	fmt.Fprint(w, usageTail)
}

func lookup(name string) (subcommand, bool) {
	for _, s := range subcommands {
		if s.name == name {
			return s, true
		}
	}
	return subcommand{}, false
}

// closest returns the subcommand within two edits of name (a typo), or "".
func closest(name string) string {
	best, bestD := "", 3
	for _, s := range subcommands {
		if d := editDistance(name, s.name); d < bestD && s.name != "run" {
			best, bestD = s.name, d
		}
	}
	return best
}

// editDistance is the Damerau-Levenshtein distance of a and b (a swap of
// two neighbours is one edit: "stauts" is one from "status").
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
