// Package testenv gives tests the real Postgres and Kafka of the test bed
// (scripts/testbed), found through OUTBOXD_TEST_PG_DSN and
// OUTBOXD_TEST_KAFKA_BROKERS: throwaway databases, a logger that writes to
// t.Log, and outboxd's relay run in-process.
//
// Without the services a test skips, and says how to start them; with CI set
// it fails instead, so CI never passes by skipping.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/relay"
)

// Services returns the test Postgres DSN and Kafka brokers.
func Services(t testing.TB) (dsn string, brokers []string) {
	t.Helper()
	dsn, b := os.Getenv("OUTBOXD_TEST_PG_DSN"), os.Getenv("OUTBOXD_TEST_KAFKA_BROKERS")
	if dsn == "" || b == "" {
		msg := "OUTBOXD_TEST_PG_DSN and OUTBOXD_TEST_KAFKA_BROKERS are not both set; run 'make test', or start " +
			"scripts/testbed/pg-start and scripts/testbed/kafka-start and source /tmp/outboxd-testbed/env"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dsn, strings.Split(b, ",")
}

// RandomSuffix returns 8 random hex digits for unique names.
func RandomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NewDatabase creates a database named t_<prefix>_<random> and returns its
// name and DSN. Cleanup drops the replication slots of the database, then the
// database.
func NewDatabase(t testing.TB, prefix string) (name, dsn string) {
	t.Helper()
	adminDSN, _ := Services(t)
	ctx := context.Background()
	name = "t_" + prefix + "_" + RandomSuffix()
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		t.Fatalf("connecting to OUTBOXD_TEST_PG_DSN: %v", err)
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

// WithDatabase returns the URL dsn pointed at database name.
func WithDatabase(dsn, name string) string {
	i := strings.LastIndex(dsn, "/")
	rest := ""
	if q := strings.Index(dsn[i:], "?"); q >= 0 {
		rest = dsn[i+q:]
	}
	return dsn[:i+1] + name + rest
}

type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Logger returns a logger that writes to t.Log.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// RelayConfig returns outboxd's default configuration pointed at database
// dsn (slot named after the database) and brokers, with fast status updates
// and no HTTP server.
func RelayConfig(dsn, slot string, brokers []string) config.Config {
	cfg := config.Default()
	cfg.Postgres.DSN, cfg.Postgres.Slot = dsn, slot
	cfg.Postgres.StatusInterval = 200 * time.Millisecond
	cfg.Kafka.Brokers = brokers
	cfg.Kafka.TopicPartitions = 3
	cfg.HTTP.Listen = ""
	return cfg
}

// StartRelay runs outboxd's relay in-process with cfg until cleanup, which
// fails the test if the relay ended with an error.
func StartRelay(t testing.TB, cfg config.Config) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(cfg, Logger(t), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	start, err := r.Check(ctx)
	if err != nil {
		cancel()
		t.Fatalf("relay check: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, start) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
}
