package wal_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync/atomic"
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
	return recordingWalsender(t, keepalive, nil, first...)
}

// recordingWalsender is fakeWalsender that also sends each standby status
// update's flush position to statuses, if not nil.
func recordingWalsender(t *testing.T, keepalive time.Duration, statuses chan<- wal.LSN, first ...pgproto3.BackendMessage) *pgconn.PgConn {
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
				m, err := be.Receive()
				if err != nil {
					return
				}
				if cd, ok := m.(*pgproto3.CopyData); ok && statuses != nil && len(cd.Data) >= 34 && cd.Data[0] == pglogrepl.StandbyStatusUpdateByteID {
					select {
					case statuses <- wal.LSN(binary.BigEndian.Uint64(cd.Data[9:])):
					case <-done:
						return
					}
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
// raise; other notices do not. It is told by its SQLSTATE, untranslated
// severity and C function: the server here speaks German (lc_messages =
// de_DE). Postgres 17's walsender warning of the same SQLSTATE and severity
// about a standby in synchronized_standby_slots that is down is passed to
// OnWarning and the stream runs on.
func TestSkippedPublicationWarning(t *testing.T) {
	skipped := &pgproto3.NoticeResponse{Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Code: "55000",
		Message: `Laden der Publikation »outboxd« übersprungen`, File: "pgoutput.c", Routine: "LoadPublications"}
	err := runStream(t, fakeWalsender(t, 50*time.Millisecond, skipped), 0, 5*time.Second)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" || !wal.PublicationSkipped(pgErr) {
		t.Fatalf("Run after the skipped-publication warning: %v, want its PgError", err)
	}
	for _, other := range []*pgproto3.NoticeResponse{
		{Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Code: "01000", Message: "etwas anderes"},
		{Severity: "HINWEIS", SeverityUnlocalized: "NOTICE", Code: "55000", Message: "skipped loading publication", Routine: "LoadPublications"},
		{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "55000", File: "slot.c", Routine: "StandbySlotsHaveCaughtup",
			Message: `replication slot "sb1" specified in parameter "synchronized_standby_slots" does not have active_pid`},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s, err := wal.StartStream(ctx, fakeWalsender(t, 50*time.Millisecond, other), wal.StreamConfig{Slot: "s", Publication: "p",
			StatusInterval: 50 * time.Millisecond}, 0, func() wal.LSN { return 0 })
		if err != nil {
			t.Fatal(err)
		}
		var warned []string
		s.OnWarning = func(w *pgconn.PgError) { warned = append(warned, w.Routine) }
		err = s.Run(ctx, ctx, make(chan []wal.Item, 100))
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run after %s %s %s: %v, want it to run on", other.SeverityUnlocalized, other.Code, other.Routine, err)
		}
		if want := other.SeverityUnlocalized == "WARNING"; (len(warned) == 1) != want {
			t.Errorf("after %s %s %s: OnWarning called for %q", other.SeverityUnlocalized, other.Code, other.Routine, warned)
		}
	}
}

// xlog wraps a pgoutput message in XLogData at lsn.
func xlog(lsn uint64, m msg) *pgproto3.CopyData {
	return &pgproto3.CopyData{Data: msg{pglogrepl.XLogDataByteID}.u64(lsn).u64(lsn).u64(0).raw(m)}
}

// A position that advances reaches the server within about
// ConfirmInterval, not at the next keepalive (StatusInterval), and
// confirmations are coalesced to at most one per ConfirmInterval. Without
// them a crash repeats up to a StatusInterval of acknowledged events.
func TestStatusConfirmsSoonAfterAck(t *testing.T) {
	const start, end, last = 0x1000, 0x2010, 0x9000
	statuses := make(chan wal.LSN, 1000)
	conn := recordingWalsender(t, 0, statuses, xlog(0x1800, begin(0x2000, 0, 7)), xlog(0x2000, commit(0x2000, end, 0)),
		xlog(0x2100, begin(0x8000, 0, 8)), xlog(0x8000, commit(0x8000, last, 0)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var pos atomic.Uint64
	pos.Store(start)
	const gap = 50 * time.Millisecond
	s, err := wal.StartStream(ctx, conn, wal.StreamConfig{Slot: "s", Publication: "p",
		StatusInterval: time.Minute, ConfirmInterval: gap}, 0, func() wal.LSN { return wal.LSN(pos.Load()) })
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan []wal.Item, 100)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, ctx, out) }()
	defer func() { cancel(); <-done }()
	// Two transactions arrive; nothing is acknowledged for a while, and
	// the stream waits for the server.
	for got := 0; got < 4; {
		select {
		case b := <-out:
			got += len(b)
		case err := <-done:
			t.Fatalf("Run ended: %v", err)
		case <-time.After(5 * time.Second):
			t.Fatal("the transaction did not come through")
		}
	}
	time.Sleep(300 * time.Millisecond)
	// Kafka acknowledges the first transaction: the position advances.
	acked := time.Now()
	pos.Store(end)
	for {
		select {
		case lsn := <-statuses:
			if lsn != end {
				continue
			}
			took := time.Since(acked)
			t.Logf("the new position reached the server %s after it advanced", took.Round(time.Millisecond))
			if took > 10*gap {
				t.Errorf("the new position reached the server %s after it advanced, want about confirm_interval (%s)", took, gap)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the new position did not reach the server in 5s (status interval: a minute)")
		}
		break
	}
	// A position that advances all the time (as the second transaction's
	// records are acknowledged one by one, say) goes at most once a gap.
	drain(statuses)
	began := time.Now()
	for p := uint64(end); time.Since(began) < 500*time.Millisecond && p < last; p++ {
		pos.Store(p)
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(began)
	n := len(drain(statuses))
	if n == 0 {
		t.Errorf("no status update in %s while the position advanced every millisecond", elapsed.Round(time.Millisecond))
	}
	if limit := int(elapsed/gap) + 2; n > limit {
		t.Errorf("%d status updates in %s while the position advanced every millisecond, want at most one per %s (%d)", n, elapsed.Round(time.Millisecond), gap, limit)
	}
	t.Logf("%d status updates in %s while the position advanced every millisecond", n, elapsed.Round(time.Millisecond))
}

func drain(ch <-chan wal.LSN) []wal.LSN {
	var out []wal.LSN
	for {
		select {
		case v := <-ch:
			out = append(out, v)
		default:
			return out
		}
	}
}
