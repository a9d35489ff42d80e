package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testenv/daemon"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/outbox"
)

// testDB is a throwaway database with the outbox table (all migrations).
type testDB struct {
	name, dsn string
	pool      *pgxpool.Pool
	brokers   []string
}

// newDB creates a database with the outbox table (all migrations); cleanup
// drops it.
func newDB(t testing.TB, prefix string) *testDB {
	t.Helper()
	_, brokers := testenv.Services(t)
	name, dsn := testenv.NewDatabase(t, prefix)
	ctx := context.Background()
	d := &testDB{name: name, dsn: dsn, brokers: brokers}
	var err error
	if d.pool, err = pgxpool.New(ctx, d.dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.pool.Close)
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

// startRelay runs outboxd on d until cleanup.
func startRelay(t *testing.T, d *testDB) {
	t.Helper()
	daemon.Start(t, daemon.Config(d.dsn, d.name, d.brokers))
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

// writeCommitted writes events with w in a transaction of its own, commits
// it, and returns their ids.
func writeCommitted(t *testing.T, pool *pgxpool.Pool, w *outbox.Writer, events ...outbox.Event) []uuid.UUID {
	t.Helper()
	var ids []uuid.UUID
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) (err error) {
		ids, err = w.Write(context.Background(), tx, events...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}
