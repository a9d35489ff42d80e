package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// slotQuery reads the slot's row: delivery lag (WAL written since the
// confirmed position), retained WAL (since restart_lsn, what Postgres keeps
// on disk for the slot), holder and WAL status, in one round trip.
const slotQuery = `SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint,
	(pg_current_wal_lsn() - restart_lsn)::bigint,
	active, active_pid, wal_status, safe_wal_size, confirmed_flush_lsn::text
	FROM pg_replication_slots WHERE slot_name = $1`

// slotWarnEvery is the most often a persisting slot read failure is logged.
const slotWarnEvery = time.Minute

// MonitorSlot reads the slot's row from pg_replication_slots every
// postgres.slot_lag_interval until ctx is done, for the slot metrics.
// A failed read (no connection, a failed query, no row for the slot) leaves
// the slot gauges at their last value, counts in outboxd_slot_read_errors_total
// and stops outboxd_slot_last_read_timestamp_seconds, which is what tells an
// operator that the gauges are stale. Failures are logged at Warn at most once
// a minute while they persist, and once at Info when reads recover; they never
// end MonitorSlot (the pipeline reports its own errors).
func (r *Relay) MonitorSlot(ctx context.Context) error {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	tick := time.NewTicker(r.cfg.Postgres.SlotLagInterval)
	defer tick.Stop()
	log := r.log.With("slot", r.cfg.Postgres.Slot)
	var failing slotFailures
	safeWALRegistered := false
	for {
		rd, err := r.readSlot(ctx, &conn)
		switch {
		case err == nil:
			r.m.slotRead(rd)
			if rd.confirmed != nil {
				if lsn, err := pglogrepl.ParseLSN(*rd.confirmed); err == nil {
					r.status.setApplied(lsn)
				}
			}
			if rd.safeWAL != nil && !safeWALRegistered {
				safeWALRegistered = r.reg.Register(r.m.slotSafeWAL) == nil
			}
			if n, recovered := failing.succeeded(); recovered {
				log.Info("reading the slot again", "failures", n)
			}
		case ctx.Err() == nil:
			r.m.slotReadErrors.Inc()
			if n, ok := failing.failed(time.Now()); ok {
				log.Warn("reading the slot; its metrics are stale", "err", err, "failures", n)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// slotReading is one row of slotQuery.
type slotReading struct {
	lag, retained, safeWAL *int64
	active                 bool
	pid                    *int32
	walStatus              *string
	confirmed              *string // confirmed_flush_lsn
}

// readSlot reads the slot's row on *conn, connecting first when there is no
// open connection. After a failed query it closes *conn, so the next read
// starts on a new connection.
func (r *Relay) readSlot(ctx context.Context, conn **pgx.Conn) (slotReading, error) {
	var rd slotReading
	if *conn == nil || (*conn).IsClosed() {
		c, err := Connect(ctx, r.cfg.Postgres)
		if err != nil {
			return rd, err
		}
		*conn = c
	}
	qctx, cancel := context.WithTimeout(ctx, max(r.cfg.Postgres.SlotLagInterval, 5*time.Second))
	defer cancel()
	err := (*conn).QueryRow(qctx, slotQuery, r.cfg.Postgres.Slot).
		Scan(&rd.lag, &rd.retained, &rd.active, &rd.pid, &rd.walStatus, &rd.safeWAL, &rd.confirmed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return rd, fmt.Errorf("slot %q does not exist in pg_replication_slots", r.cfg.Postgres.Slot)
	case err != nil:
		(*conn).Close(context.WithoutCancel(ctx))
		*conn = nil
		return rd, fmt.Errorf("reading slot %q from pg_replication_slots: %w", r.cfg.Postgres.Slot, err)
	}
	return rd, nil
}

// slotRead sets the slot gauges from a successful read.
func (m *metrics) slotRead(rd slotReading) {
	if rd.lag != nil {
		m.slotLag.Set(float64(*rd.lag))
	}
	if rd.retained != nil {
		m.slotRetained.Set(float64(*rd.retained))
	}
	m.slotActive.Set(b2f(rd.active))
	m.slotPID.Set(0)
	if rd.pid != nil {
		m.slotPID.Set(float64(*rd.pid))
	}
	if rd.walStatus != nil {
		m.setWALStatus(*rd.walStatus)
	}
	if rd.safeWAL != nil {
		m.slotSafeWAL.Set(float64(*rd.safeWAL))
	}
	m.slotLastRead.SetToCurrentTime()
}

// slotFailures throttles the logging of consecutive slot read failures.
type slotFailures struct {
	n      int       // failures since the last successful read
	warned time.Time // when the last warning was logged, zero before the first
}

// failed records a failure at now and reports the failures so far and whether
// to log: the first of a run, then at most once per slotWarnEvery.
func (f *slotFailures) failed(now time.Time) (int, bool) {
	f.n++
	if !f.warned.IsZero() && now.Sub(f.warned) < slotWarnEvery {
		return f.n, false
	}
	f.warned = now
	return f.n, true
}

// succeeded records a success and reports the failures it ends and whether
// there were any.
func (f *slotFailures) succeeded() (int, bool) {
	n := f.n
	*f = slotFailures{}
	return n, n > 0
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
