package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// A command line outboxd does not understand is an error with the usage and
// exit status 2, never a relay started with the settings of the
// environment: each subcommand takes its own flags and no other arguments.
func TestCommandLine(t *testing.T) {
	// Were a command line taken for "stream", outboxd would fail on these
	// with exit status 1 rather than 2.
	t.Setenv("OUTBOXD_POSTGRES_DSN", "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1")
	t.Setenv("OUTBOXD_KAFKA_BROKERS", "127.0.0.1:1")
	t.Setenv("OUTBOXD_HTTP_LISTEN", "")
	for _, tc := range []struct {
		args []string
		code int
		want string // in stderr
	}{
		{[]string{"stauts"}, 2, `unknown command "stauts"; did you mean "status"?`},
		{[]string{"rehsard", "-to", "4"}, 2, `unknown command "rehsard"; did you mean "reshard"?`},
		{[]string{"bogus"}, 2, `unknown command "bogus"`},
		{[]string{"-to", "4"}, 2, "flag provided but not defined: -to"},
		{[]string{"status", "-to", "4"}, 2, "flag provided but not defined: -to"},
		{[]string{"migrate", "-json"}, 2, "flag provided but not defined: -json"},
		{[]string{"healthcheck", "-check-config"}, 2, "flag provided but not defined: -check-config"},
		{[]string{"version", "-config", "outboxd.yaml"}, 2, "flag provided but not defined: -config"},
		{[]string{"status", "extra"}, 2, `unexpected argument "extra": outboxd status takes flags only`},
		{[]string{"-check-config", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"version", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"-config", "outboxd.yaml", "status"}, 2, `unexpected argument "status": the command comes first`},
		{[]string{"reshard", "-to", "-1"}, 2, "the shard count is at least 1"},
		{[]string{"reshard", "-to", "0"}, 2, "reshard -to 0: the shard count is at least 1; leave -to out"},
		{[]string{"reshard", "-to=0"}, 2, "reshard -to 0: the shard count is at least 1"},
		{[]string{"help", "nope"}, 2, `unknown command "nope"`},
		{[]string{"-h"}, 0, "outboxd reshard [-config FILE] [-to N]"},
		{[]string{"-help"}, 0, "-check-config"},
		{[]string{"help"}, 0, "outboxd status [-config FILE] [-json]"},
		{[]string{"help", "reshard"}, 0, "-to count"},
		{[]string{"status", "-h"}, 0, "-json"},
		{[]string{"reshard", "-h"}, 0, "-to count"},
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
			if tc.code == 2 && !strings.Contains(stderr.String(), "Usage:") {
				t.Fatalf("outboxd %s: no usage on stderr:\n%s", strings.Join(tc.args, " "), stderr.String())
			}
		})
	}
}

// Each subcommand reads its own flags.
func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want invocation
	}{
		{nil, invocation{cmd: "run"}},
		{[]string{"run"}, invocation{cmd: "run"}},
		{[]string{"-config", "f.yaml", "-check-config"}, invocation{cmd: "run", config: "f.yaml", check: true}},
		{[]string{"migrate", "-config", "f.yaml"}, invocation{cmd: "migrate", config: "f.yaml"}},
		{[]string{"status", "-json", "-url", "http://h:9090"}, invocation{cmd: "status", asJSON: true, url: "http://h:9090"}},
		{[]string{"reshard", "-to", "4"}, invocation{cmd: "reshard", to: 4}},
		{[]string{"reshard"}, invocation{cmd: "reshard"}}, // to postgres.shards
		{[]string{"healthcheck", "-config", "f.yaml", "-url", "http://h:9090"}, invocation{cmd: "healthcheck", config: "f.yaml", url: "http://h:9090"}},
		{[]string{"version"}, invocation{cmd: "version"}},
	} {
		got, err := parseArgs(tc.args, io.Discard)
		if err != nil || got != tc.want {
			t.Errorf("parseArgs(%q) = %+v, %v; want %+v", tc.args, got, err, tc.want)
		}
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"version"}, &out, io.Discard); err != nil || !strings.HasPrefix(out.String(), "outboxd ") {
		t.Fatalf("outboxd version: %v, %q", err, out.String())
	}
}
