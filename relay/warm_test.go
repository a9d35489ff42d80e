package relay

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testenv/daemon"
	"github.com/outboxd/outboxd/migrations"
)

// The first pipeline streams on the connections Check opened. If the server
// closed them in between, it opens new ones instead of failing and
// restarting. It needs the test bed's Postgres and Kafka.
func TestFirstPipelineReplacesClosedCheckConnections(t *testing.T) {
	_, brokers := testenv.Services(t)
	name, dsn := testenv.NewDatabase(t, "warm")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) }) // before the database is dropped
	if err := migrations.Apply(ctx, db, "public", "outbox"); err != nil {
		t.Fatal(err)
	}
	cfg := daemon.Config(dsn+"&application_name=outboxd-check", name, brokers)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	r, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	start, err := r.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Check's connection and its replication connection, closed by the server.
	const theirs = `datname = current_database() AND application_name IN ('outboxd-check', 'outboxd')`
	if _, err := db.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE `+theirs); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE `+theirs).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Check's connections still open 10 s after pg_terminate_backend")
		}
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, start) }()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(logs.String(), "msg=streaming"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not streaming after 30 s; log:\n%s", logs.String())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "restarting") {
		t.Errorf("the first pipeline failed on the closed connections and restarted; log:\n%s", logs.String())
	}
}
