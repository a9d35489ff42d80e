package outbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/relay"
)

// services returns the test Postgres DSN and Kafka brokers; it skips the
// test without them, or fails it in CI.
func services(t testing.TB) (dsn string, brokers []string) {
	t.Helper()
	dsn, b := os.Getenv("OUTBOXD_TEST_PG_DSN"), os.Getenv("OUTBOXD_TEST_KAFKA_BROKERS")
	if dsn == "" || b == "" {
		msg := "OUTBOXD_TEST_PG_DSN and OUTBOXD_TEST_KAFKA_BROKERS are not both set; start scripts/testbed/pg-start and scripts/testbed/kafka-start and source /tmp/outboxd-testbed/env"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dsn, strings.Split(b, ",")
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// testDB is a throwaway database with the outbox table (all migrations).
type testDB struct {
	name, dsn string
	pool      *pgxpool.Pool
	brokers   []string
}

// newDB creates a database; cleanup drops the slots in it, then the database.
func newDB(t testing.TB, prefix string) *testDB {
	t.Helper()
	adminDSN, brokers := services(t)
	ctx := context.Background()
	name := "t_" + prefix + "_" + randomSuffix()
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		t.Fatalf("connecting to OUTBOXD_TEST_PG_DSN: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating database %s: %v", name, err)
	}
	d := &testDB{name: name, dsn: withDatabase(adminDSN, name), brokers: brokers}
	t.Cleanup(func() {
		if d.pool != nil {
			d.pool.Close()
		}
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
	})
	d.pool, err = pgxpool.New(ctx, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := migrations.Apply(ctx, conn.Conn(), "public", "outbox"); err != nil {
		t.Fatal(err)
	}
	return d
}

// withDatabase returns the URL dsn pointed at database name.
func withDatabase(dsn, name string) string {
	i := strings.LastIndex(dsn, "/")
	rest := ""
	if q := strings.Index(dsn[i:], "?"); q >= 0 {
		rest = dsn[i+q:]
	}
	return dsn[:i+1] + name + rest
}

// logWriter sends log lines to t.Log.
type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startRelay runs outboxd's relay in-process on d until cleanup.
func startRelay(t *testing.T, d *testDB) {
	t.Helper()
	cfg := config.Default()
	cfg.Postgres.DSN = d.dsn
	cfg.Postgres.Slot = d.name
	cfg.Postgres.Publication = "outboxd"
	cfg.Postgres.Table = "public.outbox"
	cfg.Postgres.StatusInterval = 200 * time.Millisecond
	cfg.Kafka.Brokers = d.brokers
	cfg.Kafka.TopicPartitions = 3
	cfg.HTTP.Listen = ""
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r, err := relay.New(cfg, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.Check(ctx); err != nil {
		cancel()
		t.Fatalf("relay check: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
}

// readTopic consumes topic from the start until want records arrived or the
// deadline passed, then reads for settle more to catch extras.
func readTopic(t *testing.T, brokers []string, topic string, want int, settle time.Duration) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(250*time.Millisecond),
		kgo.FetchMaxWait(200*time.Millisecond),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	deadline := time.Now().Add(30 * time.Second)
	var settleAt time.Time
	for {
		now := time.Now()
		if settleAt.IsZero() && len(recs) >= want {
			settleAt = now.Add(settle)
		}
		if !settleAt.IsZero() && now.After(settleAt) {
			return recs
		}
		if now.After(deadline) {
			t.Fatalf("read %d of %d records from %s within 30s", len(recs), want, topic)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "UNKNOWN_TOPIC") {
				t.Logf("fetch %s/%d: %v", topic, p, err)
			}
		})
		recs = append(recs, fs.Records()...)
	}
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// openSQL returns a database/sql handle on d through pgx's stdlib driver.
func openSQL(t testing.TB, d *testDB) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
