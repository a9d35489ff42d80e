package test

import (
	"context"
	"testing"
	"time"
)

// A standby polls for the slot on one Postgres connection, not on a new one
// per poll: over 4 s of polls every 100 ms the database sees a handful of new
// sessions (the slot monitor's, a reconnect), not forty.
func TestStandbyPollsOnOneConnection(t *testing.T) {
	d := newDB(t)
	_, b := startPair(t, d.env("OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=100ms"))
	b.waitReady(503, 10*time.Second)
	sessions := func() int64 {
		ctx := context.Background()
		var n int64
		if _, err := d.pool.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			t.Fatal(err)
		}
		if err := d.pool.QueryRow(ctx, `SELECT sessions FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	time.Sleep(time.Second) // statistics are flushed about once a second
	before := sessions()
	time.Sleep(4 * time.Second)
	time.Sleep(time.Second)
	opened := sessions() - before
	t.Logf("%d sessions opened on the database during 4 s of standby polls every 100 ms", opened)
	if opened > 10 {
		t.Errorf("%d sessions opened during 4 s of standby polls every 100 ms; want the standby to keep one connection", opened)
	}
}
