package wal_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxd/outboxd/wal"
)

// fakeWalsender accepts one connection over a pipe, answers the start-up
// and START_REPLICATION, then sends a keepalive every keepalive (never if 0)
// until the test ends. It stands for a walsender behind a middlebox that
// keeps the connection open and forwards nothing.
func fakeWalsender(t *testing.T, keepalive time.Duration, first ...pgproto3.BackendMessage) *pgconn.PgConn {
	t.Helper()
	client, server := net.Pipe()
	done := make(chan struct{})
	t.Cleanup(func() { close(done); server.Close(); client.Close() })
	go func() {
		be := pgproto3.NewBackend(server, server)
		if _, err := be.ReceiveStartupMessage(); err != nil {
			return
		}
		be.Send(&pgproto3.AuthenticationOk{})
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		if be.Flush() != nil {
			return
		}
		if _, err := be.Receive(); err != nil { // START_REPLICATION
			return
		}
		be.Send(&pgproto3.CopyBothResponse{})
		for _, m := range first {
			be.Send(m)
		}
		if be.Flush() != nil {
			return
		}
		go func() { // drain status updates
			for {
				if _, err := be.Receive(); err != nil {
					return
				}
			}
		}()
		if keepalive == 0 {
			<-done
			return
		}
		tick := time.NewTicker(keepalive)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				msg := make([]byte, 18)
				msg[0] = pglogrepl.PrimaryKeepaliveMessageByteID
				binary.BigEndian.PutUint64(msg[1:], 0x1000)
				be.Send(&pgproto3.CopyData{Data: msg})
				if be.Flush() != nil {
					return
				}
			}
		}
	}()
	cfg, err := pgconn.ParseConfig("postgres://u@127.0.0.1/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.LookupFunc = func(context.Context, string) ([]string, error) { return []string{"127.0.0.1"}, nil }
	cfg.DialFunc = func(context.Context, string, string) (net.Conn, error) { return client, nil }
	conn, err := pgconn.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connecting to the fake walsender: %v", err)
	}
	return conn
}

func runStream(t *testing.T, conn *pgconn.PgConn, timeout time.Duration, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	s, err := wal.StartStream(ctx, conn, wal.StreamConfig{Slot: "s", Publication: "p",
		StatusInterval: 50 * time.Millisecond, ReceiveTimeout: timeout}, 0, func() wal.LSN { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan []wal.Item, 100)
	return s.Run(ctx, ctx, out)
}

// A server that sends nothing at all ends the stream with ErrSilentServer
// after about the receive timeout; one that sends keepalives does not.
func TestReceiveTimeout(t *testing.T) {
	t.Run("silent server", func(t *testing.T) {
		start := time.Now()
		err := runStream(t, fakeWalsender(t, 0), 300*time.Millisecond, 10*time.Second)
		if !errors.Is(err, wal.ErrSilentServer) {
			t.Fatalf("Run on a silent server: %v, want ErrSilentServer", err)
		}
		t.Logf("ended after %s", time.Since(start).Round(time.Millisecond))
	})
	t.Run("keepalives", func(t *testing.T) {
		err := runStream(t, fakeWalsender(t, 50*time.Millisecond), 300*time.Millisecond, 1500*time.Millisecond)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run with keepalives every 50ms: %v, want it to run until its context ends", err)
		}
	})
	t.Run("no timeout", func(t *testing.T) {
		err := runStream(t, fakeWalsender(t, 0), 0, time.Second)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run with receive timeout 0: %v, want it to run until its context ends", err)
		}
	})
}

func TestParseSetting(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
	}{{"60s", time.Minute}, {"1min", time.Minute}, {"0", 0}, {"500ms", 500 * time.Millisecond}, {"2h", 2 * time.Hour}, {"1d", 24 * time.Hour}, {"1500", 1500 * time.Millisecond}} {
		got, err := wal.ParseSetting(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSetting(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "s", "1x", "-1s", "1.5s"} {
		if _, err := wal.ParseSetting(in); err == nil {
			t.Errorf("ParseSetting(%q): no error", in)
		}
	}
}

// Postgres 18's warning that pgoutput skipped a missing publication ends
// the stream with it as a *pgconn.PgError, as the error earlier versions
// raise; other notices do not. It is told by its SQLSTATE and untranslated
// severity: the server here speaks German (lc_messages = de_DE).
func TestSkippedPublicationWarning(t *testing.T) {
	skipped := &pgproto3.NoticeResponse{Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Code: "55000",
		Message: `Laden der Publikation »outboxd« übersprungen`}
	err := runStream(t, fakeWalsender(t, 50*time.Millisecond, skipped), 0, 5*time.Second)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" || !wal.PublicationSkipped(pgErr.Code, pgErr.SeverityUnlocalized) {
		t.Fatalf("Run after the skipped-publication warning: %v, want its PgError", err)
	}
	for _, other := range []*pgproto3.NoticeResponse{
		{Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Code: "01000", Message: "etwas anderes"},
		{Severity: "HINWEIS", SeverityUnlocalized: "NOTICE", Code: "55000", Message: "skipped loading publication"},
	} {
		if err := runStream(t, fakeWalsender(t, 50*time.Millisecond, other), 0, time.Second); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run after %s %s: %v, want it to run on", other.SeverityUnlocalized, other.Code, err)
		}
	}
}
