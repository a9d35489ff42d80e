package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/dlq"
	"github.com/outboxd/outboxd/sink"
)

const dlqUsage = `Usage:
  outboxd dlq list [-config FILE] [-topic T] [-id ID] [-since S] [-all] [-json]
      show the dead letters: event id, age, intended topic, source LSN, reason
  outboxd dlq redrive [-config FILE] [-topic T] [-id ID] [-since S] [-batch N] [-dry-run] [-json]
      send pending dead letters to their intended topics, once their cause is fixed

The topic defaults to router.poison.dlq_topic; where the entries of
postgres.tables dead-letter to topics of their own, other than it, pass
-topic (each is listed and redriven on its own). A redriven record goes to its
intended topic with its original key, value and headers (without the
outboxd.error.*, outboxd.source.*, outboxd.intended.topic and outboxd.dlq.*
headers), partitioned by its key as outboxd partitions (Kafka's murmur2), by
an idempotent producer with acks=all; in kafka.delivery: exactly_once in Kafka
transactions. Its id header is the original's, so a consumer that
deduplicates on it sees an event once however often it is redriven. Each
dead letter names its id and event type headers (outboxd.dlq.id.header,
outboxd.dlq.event.type.header: they may differ per table); one written by
an outboxd before they were recorded is read with router.id_header.

Redrive marks each dead letter it sent with a marker record in the
dead-letter topic (header outboxd.dlq.redriven), so a second run does not send
it again and a killed run resumes; at_least_once may send again the records of
a run killed before their markers were written. A dead letter that fails
again stays in the topic, written again with the new reason (header
outboxd.dlq.supersedes). Dead letters without their payload or headers (too
large), without an intended topic or event id cannot be redriven: send those
events again from the outbox table (outboxd replay). Run one redrive of a
topic at a time. Exit status: 0 when every selected dead letter was redriven
(or -dry-run), 1 when some failed again or could not be redriven, 2 on a wrong
command line.
`

// dlqFlags are the flags of "outboxd dlq list" and "outboxd dlq redrive".
type dlqFlags struct {
	config, topic, since string
	ids                  idList
	asJSON, all, dryRun  bool
	batch                int
}

// idList is -id: repeated, or ids separated by commas.
type idList []string

func (l *idList) String() string     { return strings.Join(*l, ",") }
func (l *idList) Set(s string) error { *l = append(*l, s); return nil }

// parseDLQ reads "list|redrive FLAGS".
func parseDLQ(args []string, stderr io.Writer) (string, dlqFlags, error) {
	var f dlqFlags
	usage := func() { fmt.Fprint(stderr, dlqUsage) }
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		usage()
		if len(args) == 0 {
			fmt.Fprintln(stderr, "\noutboxd dlq: name a command, list or redrive")
			return "", f, errUsage
		}
		return "", f, errHelp
	}
	cmd := args[0]
	if cmd != "list" && cmd != "redrive" {
		fmt.Fprintf(stderr, "outboxd dlq: unknown command %q; the commands are list and redrive\n\n", cmd)
		usage()
		return "", f, errUsage
	}
	fs := flag.NewFlagSet("outboxd dlq "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		usage()
		fmt.Fprintf(stderr, "\nFlags of %s:\n", cmd)
		fs.PrintDefaults()
	}
	fs.StringVar(&f.config, "config", "", "YAML configuration `file` (the daemon's)")
	fs.StringVar(&f.topic, "topic", "", "the dead-letter `topic` (default router.poison.dlq_topic, when the tables write to one)")
	fs.Var(&f.ids, "id", "only the dead letters of this event `id` (repeat, or separate with commas)")
	fs.StringVar(&f.since, "since", "", "only those dead-lettered since `S`: a duration back from now (24h) or a time (2026-11-26T10:00:00Z)")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON, one object a line")
	if cmd == "list" {
		fs.BoolVar(&f.all, "all", false, "show redriven and superseded dead letters too, with a STATUS column")
	} else {
		fs.BoolVar(&f.dryRun, "dry-run", false, "list what would be redriven, and send nothing")
		fs.IntVar(&f.batch, "batch", 500, "dead letters per `batch` (per Kafka transaction in exactly_once), at most kafka.max_buffered_records")
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return "", f, errHelp
		}
		return "", f, errUsage
	}
	if cmd == "redrive" && f.batch < 1 {
		fmt.Fprintf(stderr, "outboxd dlq %s: -batch %d: give at least 1\n\n", cmd, f.batch)
		fs.Usage()
		return "", f, errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "outboxd dlq %s: unexpected argument %q: it takes flags only\n\n", cmd, fs.Arg(0))
		fs.Usage()
		return "", f, errUsage
	}
	return cmd, f, nil
}

// dlqCommand runs "outboxd dlq ...".
func dlqCommand(args []string, stdout, stderr io.Writer) error {
	cmd, f, err := parseDLQ(args, stderr)
	if errors.Is(err, errHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	now := time.Now()
	since, err := dlq.ParseSince(f.since, now)
	if err != nil {
		fmt.Fprintf(stderr, "outboxd dlq %s: %v\n", cmd, err)
		return errUsage
	}
	cfg, err := config.Load(f.config, os.Environ())
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	topic, err := dlqTopic(f.topic, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "outboxd dlq %s: %v\n", cmd, err)
		return errUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	filter := dlq.Filter{IDs: dlq.ParseIDs(f.ids), Since: since, All: f.all}
	if cmd == "list" || f.dryRun {
		t, err := dlq.Read(ctx, cfg.Kafka, dlq.FallbackOf(cfg), topic)
		if err != nil {
			return err
		}
		letters := t.Select(filter)
		if f.asJSON {
			return dlq.WriteJSON(stdout, letters, now)
		}
		return dlq.WriteTable(stdout, letters, now, f.all)
	}
	res, err := dlq.Redrive(ctx, cfg, dlq.Options{Topic: topic, Filter: filter, Batch: f.batch}, newLogger(cfg.Log, stderr))
	if res != nil {
		if werr := writeRedrive(stdout, res, f.asJSON); werr != nil && err == nil {
			err = werr
		}
	}
	var fenced *sink.FencedError
	if errors.As(err, &fenced) {
		return fmt.Errorf("redriving %s: another redrive of this topic started and fenced this one (what this run did is marked); "+
			"let it finish, then run 'outboxd dlq list -topic %s' to see what is left: %w", topic, topic, err)
	}
	if err != nil {
		return fmt.Errorf("redriving %s (what is done is marked; run it again to resume): %w", topic, err)
	}
	if len(res.NotPending) > 0 {
		return fmt.Errorf("no pending dead letter in %s for event %s; 'outboxd dlq list -all -id ID' shows what became of one",
			topic, strings.Join(res.NotPending, ", "))
	}
	if n := len(res.Failed) + len(res.Skipped); n > 0 {
		return fmt.Errorf("%d dead letters of %s were not redriven; 'outboxd dlq list -topic %s' shows why", n, topic, topic)
	}
	return nil
}

// dlqTopic returns the dead-letter topic of a command: -topic, else the one
// candidate topic, else an error that lists them all. The candidates are
// the topics the tables dead-letter to (config.Config.DLQTopics) and a set
// top-level router.poison.dlq_topic, even where no table writes to it now
// (its policy halt, or every entry with a topic of its own): it may hold
// dead letters from before, which would otherwise be passed over silently.
func dlqTopic(flagged string, cfg config.Config) (string, error) {
	if flagged != "" {
		return flagged, nil
	}
	topics := cfg.DLQTopics()
	if t := cfg.Router.Poison.DLQTopic; t != "" && !slices.Contains(topics, t) {
		topics = append(topics, t)
		slices.Sort(topics)
	}
	switch len(topics) {
	case 0:
		return "", errors.New("no dead-letter topic: pass -topic, or set router.poison.dlq_topic")
	case 1:
		return topics[0], nil
	}
	return "", fmt.Errorf("the configuration names several topics (%s): pass -topic with one of them "+
		"(the topics the outbox tables dead-letter to, and router.poison.dlq_topic, which may hold older dead letters)", strings.Join(topics, ", "))
}

// writeRedrive reports what a redrive did.
func writeRedrive(w io.Writer, res *dlq.Result, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(res)
	}
	fmt.Fprintf(w, "redriven: %d, failed again: %d, not redrivable: %d\n", len(res.Redriven), len(res.Failed), len(res.Skipped))
	for _, f := range res.Failed {
		fmt.Fprintf(w, "failed again: %s %s: %s\n", f.Ref(), f.EventID, f.Again)
	}
	for _, l := range res.Skipped {
		fmt.Fprintf(w, "not redrivable: %s %s: %s\n", l.Ref(), l.EventID, l.NotRedrivable)
	}
	return nil
}
