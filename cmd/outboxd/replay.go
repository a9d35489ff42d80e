package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/replay"
)

// replayUsage is replay's line in the usage.
const replayUsage = `outboxd replay -where COND [-config FILE] [-to-topic T] [-rate N] [-order COL]
                                           send rows still in the outbox table to
                                           Kafka again, beside the running outboxd
                                           (rows already deleted cannot be); -resume
                                           ID resumes a stopped run`

// replayFlags are replay's flags, into inv.replay.
func replayFlags(fs *flag.FlagSet, inv *invocation) {
	configFlag(fs, inv)
	o := &inv.replay
	fs.StringVar(&o.Where, "where", "", "the `condition` the rows to send match, the body of a SQL WHERE over the outbox table's columns "+
		"(required for a new run; -where true sends every row). Only rows still in the table match: deleted rows cannot be replayed")
	fs.StringVar(&o.Table, "table", "", "the outbox `table` (default postgres.table; with several postgres.tables, required: one of them)")
	fs.StringVar(&o.ToTopic, "to-topic", "", "send every record to this `topic` instead of the one the router chooses")
	fs.Float64Var(&o.Rate, "rate", replay.DefaultRate, "at most this many `records` per second, so that the replay leaves room for live delivery (0: no limit)")
	fs.StringVar(&o.Order, "order", "", "the `column` whose order each key's records keep, with the primary key breaking ties (default created_at if the table has it, else the primary key)")
	fs.IntVar(&o.Batch, "batch", replay.DefaultBatch, "`rows` read and acknowledged at a time; a resumed run sends again at most this many")
	fs.StringVar(&o.Resume, "resume", "", "resume the run of this `id` (printed when it started) where Kafka's acknowledgements reached")
	fs.StringVar(&o.StateTable, "state-table", "", "the `table` runs keep their progress in, created if missing (default outboxd_replay in the outbox table's schema)")
	fs.DurationVar(&o.Progress, "progress", replay.DefaultProgress, "time between two progress lines in the log")
}

// runReplay runs outboxd replay: the run's id first, so that a stopped run
// can be resumed, then its summary, on stdout; progress goes to the log.
func runReplay(ctx context.Context, cfg config.Config, opts replay.Options, log *slog.Logger, stdout io.Writer) error {
	r, err := replay.Open(ctx, cfg, opts, log)
	if err != nil {
		return err
	}
	defer r.Close()
	verb := "started"
	if r.Resumed() {
		verb = "resumed"
	}
	fmt.Fprintf(stdout, "replay %s %s; if it stops, resume it with: outboxd replay -resume %s\n", r.ID(), verb, r.ID())
	sum, err := r.Run(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, sum)
	return nil
}
