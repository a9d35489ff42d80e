package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/internal/status"
	"github.com/outboxd/outboxd/wal"
)

// With the HTTP server off there is nothing to probe: healthcheck says so
// instead of failing on a URL without a host.
func TestHealthcheckWithoutHTTP(t *testing.T) {
	t.Setenv("OUTBOXD_HTTP_LISTEN", "")
	err := run([]string{"healthcheck"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "http.listen is empty") {
		t.Fatalf("healthcheck with http.listen empty: %v; want it to say that there is nothing to probe", err)
	}
}

// A missing or invalidated slot exits with status.ExitSlotGone, which the
// systemd unit does not restart on: a restart on timeline 1 would create a
// new slot past what the old one had not confirmed.
func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{errors.New("cannot connect"), 1},
		{fmt.Errorf("%w: %w", errReported, wal.Errorf(wal.ErrSlotMissing, "replication slot %q was dropped", "outboxd")), status.ExitSlotGone},
		{fmt.Errorf("%w: %w", errReported, wal.Errorf(wal.ErrSlotLost, "invalidated")), status.ExitSlotGone},
		// A server's error is not judged here, by code or text: Run turns it
		// into wal.ErrSlotMissing after reading pg_replication_slots.
		{fmt.Errorf("starting replication: %w", &pgconn.PgError{Code: "42704", Message: `replication slot "outboxd" does not exist`}), 1},
		{fmt.Errorf("%w: %w", errReported, wal.Errorf(wal.ErrPublicationMissing, "publication dropped")), 1},
		{&pgconn.PgError{Code: "42704", Message: `publication "outboxd" does not exist`}, 1},
	} {
		if got := exitCode(tc.err); got != tc.want {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
	if status.ExitSlotGone == 1 || status.ExitSlotGone == 2 {
		t.Errorf("ExitSlotGone %d: 1 is every other error, 2 Go's own exit on a panic", status.ExitSlotGone)
	}
}

// The error is printed on one line (unless it was logged already) and what
// to do on a line of its own (issue 34 item 4).
func TestPrintError(t *testing.T) {
	lost := &wal.Error{Kind: wal.ErrSlotLost, Msg: `replication slot "outboxd" is invalidated`, Remedy: "drop the slot and start outboxd again"}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"plain", errors.New("cannot connect"), "outboxd: cannot connect\n"},
		{"with a hint", fmt.Errorf("starting: %w", lost),
			"outboxd: starting: replication slot \"outboxd\" is invalidated\nhint: drop the slot and start outboxd again\n"},
		{"logged, with a hint", fmt.Errorf("%w: %w", errReported, lost), "hint: drop the slot and start outboxd again\n"},
		{"logged", fmt.Errorf("%w: %w", errReported, errors.New("cannot connect")), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			printError(&b, tc.err)
			if b.String() != tc.want {
				t.Errorf("printed %q, want %q", b.String(), tc.want)
			}
		})
	}
}

// SIGTERM during the start-up checks is a clean stop (exit 0) only when the
// checks fail on the cancellation; a real start-up failure that arrives
// with the signal still exits 1, and either way the error is logged (review
// of issue 32 item 17, finding 8).
func TestStartUpStoppedBySignal(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	sasl := errors.New("kafka: SASL authentication failed: check kafka.sasl")
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		err     error // what the start-up checks return
		stopped bool
	}{
		{"cancelled, cut short", cancelled, fmt.Errorf("connecting to postgres.dsn: %w", context.Canceled), true},
		{"cancelled, timed out", cancelled, fmt.Errorf("waiting for Kafka: %w", context.DeadlineExceeded), true},
		{"cancelled, a real failure", cancelled, sasl, false},
		{"cancelled, a permanent failure", cancelled, permanentErr{context.Canceled}, false},
		{"not cancelled, a cancellation", context.Background(), fmt.Errorf("dial: %w", context.Canceled), false},
		{"not cancelled, a real failure", context.Background(), sasl, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			stopped, err := startUpEnded(tc.ctx, tc.err, log, "outboxd")
			if stopped != tc.stopped || (err == nil) != tc.stopped {
				t.Fatalf("startUpEnded = %v, %v; want stopped %v and the error returned otherwise", stopped, err, tc.stopped)
			}
			if tc.stopped {
				if !strings.Contains(logs.String(), `msg="stopped during the start-up checks"`) || !strings.Contains(logs.String(), "err=") {
					t.Errorf("logged %q; want the Info line with the error", logs.String())
				}
				return
			}
			if code := exitCode(err); code == 0 {
				t.Errorf("exit %d for %v", code, err)
			}
		})
	}
	if stopped, err := startUpEnded(cancelled, nil, slog.New(slog.DiscardHandler), "outboxd"); stopped || err != nil {
		t.Errorf("a start that succeeds: %v, %v", stopped, err)
	}
}

// permanentErr answers for itself that it is permanent (relay.IsPermanent).
type permanentErr struct{ error }

func (permanentErr) Permanent() bool { return true }
func (e permanentErr) Unwrap() error { return e.error }
