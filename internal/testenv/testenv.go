// Package testenv gives tests the real Postgres and Kafka of the test bed
// (scripts/testbed), found through OUTBOXD_TEST_PG_DSN and
// OUTBOXD_TEST_KAFKA_BROKERS: throwaway databases and a logger that writes
// to t.Log. It imports nothing of outboxd's engine, so the tests of the
// client libraries (outbox, consumer) that use it do not compile the
// daemon; package daemon, below it, runs outboxd for the tests that need it.
//
// Without the services a test skips, and says how to start them; with CI set
// it fails instead, so CI never passes by skipping.
package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Services returns the test Postgres DSN and Kafka brokers.
func Services(t testing.TB) (dsn string, brokers []string) {
	t.Helper()
	dsn, b := os.Getenv("OUTBOXD_TEST_PG_DSN"), os.Getenv("OUTBOXD_TEST_KAFKA_BROKERS")
	if dsn == "" || b == "" {
		skipOrFail(t, "OUTBOXD_TEST_PG_DSN and OUTBOXD_TEST_KAFKA_BROKERS are not both set; run 'make test', or start "+
			"scripts/testbed/pg-start and scripts/testbed/kafka-start and source /tmp/outboxd-testbed/env")
	}
	return dsn, strings.Split(b, ",")
}

// PostgresDSN returns the test Postgres DSN, for a test that needs no Kafka.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("OUTBOXD_TEST_PG_DSN")
	if dsn == "" {
		skipOrFail(t, "OUTBOXD_TEST_PG_DSN is not set; run 'make test', or start scripts/testbed/pg-start and source /tmp/outboxd-testbed/env")
	}
	return dsn
}

// skipOrFail skips the test, or fails it in CI, where nothing may skip.
func skipOrFail(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// RandomSuffix returns 8 random hex digits for unique names.
func RandomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NewDatabase creates a database named t_<prefix>_<random> on the test
// Postgres and returns its name and DSN. Cleanup drops the replication slots
// of the database, then the database.
func NewDatabase(t testing.TB, prefix string) (name, dsn string) {
	t.Helper()
	return CreateDatabase(t, PostgresDSN(t), prefix)
}

// CreateDatabase is NewDatabase on the server of adminDSN.
func CreateDatabase(t testing.TB, adminDSN, prefix string) (name, dsn string) {
	t.Helper()
	ctx := context.Background()
	name = "t_" + prefix + "_" + RandomSuffix()
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		t.Fatalf("connecting to Postgres at OUTBOXD_TEST_PG_DSN: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating database %s: %v", name, err)
	}
	t.Cleanup(func() { dropDatabase(t, adminDSN, name) })
	return name, WithDatabase(adminDSN, name)
}

func dropDatabase(t testing.TB, adminDSN, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer admin.Close(ctx)
	for ctx.Err() == nil { // a walsender releases its slot a moment after its client goes
		_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active`, name)
		_, err := admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name)
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		t.Logf("cleanup: dropping database %s: %v", name, err)
	}
}

// Connect connects to a new database of the test bed's Postgres
// (NewDatabase), runs setup there, and closes the connection when the
// test ends.
func Connect(t testing.TB, prefix, setup string) *pgx.Conn {
	t.Helper()
	_, dsn := NewDatabase(t, prefix)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, setup); err != nil {
		t.Fatal(err)
	}
	return conn
}

// WithDatabase returns the URL dsn pointed at database name.
func WithDatabase(dsn, name string) string {
	i := strings.LastIndex(dsn, "/")
	rest := ""
	if q := strings.Index(dsn[i:], "?"); q >= 0 {
		rest = dsn[i+q:]
	}
	return dsn[:i+1] + name + rest
}

// LogWriter returns a writer that passes what it is given to t.Log, a line
// at a time; a line's end may come in a later Write.
func LogWriter(t testing.TB) io.Writer { return &logWriter{t: t} }

type logWriter struct {
	t       testing.TB
	mu      sync.Mutex
	partial []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.t.Log(string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

// Logger returns a logger that writes to t.Log.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(LogWriter(t), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// Buffer is a log that the code under test writes from its goroutines
// while the test reads it (String).
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
