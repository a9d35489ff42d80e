package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/relay"
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

// A missing or invalidated slot exits with relay.ExitSlotGone, which the
// systemd unit does not restart on: a restart on timeline 1 would create a
// new slot past what the old one had not confirmed.
func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{errors.New("cannot connect"), 1},
		{fmt.Errorf("%w: %w", errReported, wal.Errorf(wal.ErrSlotMissing, "replication slot %q was dropped", "outboxd")), relay.ExitSlotGone},
		{fmt.Errorf("%w: %w", errReported, wal.Errorf(wal.ErrSlotLost, "invalidated")), relay.ExitSlotGone},
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
	if relay.ExitSlotGone == 1 || relay.ExitSlotGone == 2 {
		t.Errorf("ExitSlotGone %d: 1 is every other error, 2 Go's own exit on a panic", relay.ExitSlotGone)
	}
}
