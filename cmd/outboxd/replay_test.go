package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/replay"
)

func TestReplayCommandLine(t *testing.T) {
	got, err := parseArgs([]string{"replay", "-where", "created_at >= '2026-01-01'", "-to-topic", "again", "-rate", "50", "-order", "seq",
		"-batch", "100", "-state-table", "ops.replays", "-progress", "1s"}, io.Discard)
	want := invocation{cmd: "replay", replay: replay.Options{Where: "created_at >= '2026-01-01'", ToTopic: "again", Rate: 50, Order: "seq",
		Batch: 100, StateTable: "ops.replays", Progress: time.Second}}
	if err != nil || got != want {
		t.Fatalf("parseArgs = %+v, %v; want %+v", got, err, want)
	}
	got, err = parseArgs([]string{"replay", "-resume", "r1"}, io.Discard)
	want = invocation{cmd: "replay", replay: replay.Options{Resume: "r1", Rate: replay.DefaultRate, Batch: replay.DefaultBatch, Progress: replay.DefaultProgress}}
	if err != nil || got != want {
		t.Fatalf("parseArgs = %+v, %v; want %+v", got, err, want)
	}

	// The help says what cannot be replayed.
	var stderr bytes.Buffer
	if err := run([]string{"help", "replay"}, io.Discard, &stderr); err != nil || !strings.Contains(stderr.String(), "rows already deleted cannot be") ||
		!strings.Contains(stderr.String(), "deleted rows cannot be replayed") {
		t.Fatalf("outboxd help replay: %v\n%s", err, stderr.String())
	}

	// A clause that would change the statement is refused before any
	// connection, with exit status 1.
	t.Setenv("OUTBOXD_POSTGRES_DSN", "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1")
	t.Setenv("OUTBOXD_KAFKA_BROKERS", "127.0.0.1:1")
	for args, want := range map[string]string{
		"true; DROP TABLE outbox": "-where holds a ';' at character 5",
		"":                        "-where is empty",
	} {
		err := run([]string{"replay", "-where", args}, io.Discard, io.Discard)
		if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), want) {
			t.Errorf("outboxd replay -where %q: %v, want exit 1 with %q", args, err, want)
		}
	}
}
