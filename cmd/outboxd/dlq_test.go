package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/config"
)

// "outboxd dlq" takes a command, list or redrive, and that command's flags;
// a wrong command line exits 2 and says what is wrong, -h exits 0.
func TestDLQCommandLine(t *testing.T) {
	t.Setenv("OUTBOXD_POSTGRES_DSN", "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1")
	t.Setenv("OUTBOXD_KAFKA_BROKERS", "127.0.0.1:1")
	t.Setenv("OUTBOXD_ROUTER_POISON_DLQ_TOPIC", "")
	for _, tc := range []struct {
		args []string
		code int
		want string // in stderr
	}{
		{[]string{"dlq"}, 2, "name a command, list or redrive"},
		{[]string{"dlq", "-h"}, 0, "outboxd dlq redrive [-config FILE]"},
		{[]string{"dlq", "lsit"}, 2, `unknown command "lsit"; the commands are list and redrive`},
		{[]string{"dlq", "list", "-h"}, 0, "show redriven and superseded dead letters too"},
		{[]string{"dlq", "redrive", "-h"}, 0, "-dry-run"},
		{[]string{"dlq", "redrive", "-all"}, 2, "flag provided but not defined: -all"},
		{[]string{"dlq", "list", "-dry-run"}, 2, "flag provided but not defined: -dry-run"},
		{[]string{"dlq", "redrive", "-batch", "0"}, 2, "-batch 0: give at least 1"},
		{[]string{"dlq", "list", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"dlq", "list", "-since", "yesterday"}, 2, `-since "yesterday" is neither a duration`},
		{[]string{"dlq", "list"}, 2, "no dead-letter topic: pass -topic, or set router.poison.dlq_topic"},
		{[]string{"help"}, 0, "outboxd dlq list|redrive"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			err := run(tc.args, io.Discard, &stderr)
			code := 0
			if err != nil {
				code = exitCode(err)
			}
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("outboxd %s: exit %d (%v), want %d with %q on stderr; stderr:\n%s",
					strings.Join(tc.args, " "), code, err, tc.code, tc.want, stderr.String())
			}
		})
	}
}

// Without -topic, the dead-letter topic is the one the tables write to; where
// entries of postgres.tables have topics of their own, -topic chooses.
func TestDLQTopic(t *testing.T) {
	cfg := config.Default()
	cfg.Postgres.Table = ""
	if err := yaml.Unmarshal([]byte(`[a.outbox, {name: b.outbox, router: {poison: {policy: dlq, dlq_topic: b-dlq}}}]`), &cfg.Postgres.Tables); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, flag, top, want, err string
		halt                       bool
	}{
		{name: "one table dead-letters", want: "b-dlq"},
		{name: "-topic", flag: "x", top: "dlq", want: "x"},
		{name: "several topics", top: "dlq", err: "several topics (b-dlq, dlq): pass -topic"},
		// A top-level topic no table writes to now may hold dead letters
		// from when it was written to: not passed over silently.
		{name: "top-level topic under halt", top: "dlq", halt: true, err: "several topics (b-dlq, dlq): pass -topic"},
		{name: "top-level topic is the table's", top: "b-dlq", halt: true, want: "b-dlq"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			if tc.top != "" {
				c.Router.Poison = config.Poison{Policy: config.PoisonDLQ, DLQTopic: tc.top}
				if tc.halt {
					c.Router.Poison.Policy = config.PoisonHalt
				}
			}
			got, err := dlqTopic(tc.flag, c)
			if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("dlqTopic(%q) = %q, %v; want %q, %q", tc.flag, got, err, tc.want, tc.err)
			}
		})
	}
}
