package slotlag

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/wal"
	"github.com/prometheus/client_golang/prometheus"
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

// Monitor reads one slot's row from pg_replication_slots for the slot
// metrics (outboxd_slot_*).
type Monitor struct {
	pg  config.Postgres
	log *slog.Logger
	m   *metrics
	reg prometheus.Registerer
}

// New returns a Monitor of pg.Slot with its metrics on reg.
func New(pg config.Postgres, log *slog.Logger, reg prometheus.Registerer) *Monitor {
	return &Monitor{pg: pg, log: log, m: newMetrics(reg), reg: reg}
}

// Run reads the slot's row every postgres.slot_lag_interval until ctx is
// done, and passes each confirmed_flush_lsn read to confirmed (which may be
// nil).
// A failed read (no connection, a failed query, no row for the slot) leaves
// the slot gauges at their last value, counts in outboxd_slot_read_errors_total
// and stops outboxd_slot_last_read_timestamp_seconds, which is what tells an
// operator that the gauges are stale. Failures are logged at Warn at most once
// a minute while they persist, and once at Info when reads recover; they never
// end Run (the pipeline reports its own errors).
func (r *Monitor) Run(ctx context.Context, confirmed func(wal.LSN)) error {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	tick := time.NewTicker(r.pg.SlotLagInterval)
	defer tick.Stop()
	log := r.log.With("slot", r.pg.Slot)
	var failing slotFailures
	safeWALRegistered := false
	for {
		rd, err := r.readSlot(ctx, &conn)
		switch {
		case err == nil:
			r.m.read(rd)
			if rd.confirmed != nil {
				if lsn, err := pglogrepl.ParseLSN(*rd.confirmed); err == nil && confirmed != nil {
					confirmed(lsn)
				}
			}
			if rd.safeWAL != nil && !safeWALRegistered {
				safeWALRegistered = r.reg.Register(r.m.safeWAL) == nil
			}
			if n, recovered := failing.succeeded(); recovered {
				log.Info("reading the slot again", "failures", n)
			}
		case ctx.Err() == nil:
			r.m.readErrors.Inc()
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
func (r *Monitor) readSlot(ctx context.Context, conn **pgx.Conn) (slotReading, error) {
	var rd slotReading
	if *conn == nil || (*conn).IsClosed() {
		c, err := pg.Connect(ctx, r.pg)
		if err != nil {
			return rd, err
		}
		*conn = c
	}
	qctx, cancel := context.WithTimeout(ctx, max(r.pg.SlotLagInterval, 5*time.Second))
	defer cancel()
	err := (*conn).QueryRow(qctx, slotQuery, r.pg.Slot).
		Scan(&rd.lag, &rd.retained, &rd.active, &rd.pid, &rd.walStatus, &rd.safeWAL, &rd.confirmed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return rd, fmt.Errorf("slot %q does not exist in pg_replication_slots", r.pg.Slot)
	case err != nil:
		(*conn).Close(context.WithoutCancel(ctx))
		*conn = nil
		return rd, fmt.Errorf("reading slot %q from pg_replication_slots: %w", r.pg.Slot, err)
	}
	return rd, nil
}

// read sets the slot gauges from a successful read.
func (m *metrics) read(rd slotReading) {
	if rd.lag != nil {
		m.lag.Set(float64(*rd.lag))
	}
	if rd.retained != nil {
		m.retained.Set(float64(*rd.retained))
	}
	m.active.Set(gaugeValue(rd.active))
	m.pid.Set(0)
	if rd.pid != nil {
		m.pid.Set(float64(*rd.pid))
	}
	if rd.walStatus != nil {
		m.setWALStatus(*rd.walStatus)
	}
	if rd.safeWAL != nil {
		m.safeWAL.Set(float64(*rd.safeWAL))
	}
	m.lastRead.SetToCurrentTime()
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

// gaugeValue is a gauge's value for a yes-or-no state: 1 or 0.
func gaugeValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

type metrics struct {
	lag, retained, lastRead, active, pid, safeWAL prometheus.Gauge
	readErrors                                    prometheus.Counter
	walStatus                                     *prometheus.GaugeVec
}

// walStatuses are the values of pg_replication_slots.wal_status.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// newMetrics registers the slot metrics on reg, all but safeWAL: Run
// registers it at the first read that has a value for it (a server with
// max_slot_wal_keep_size unlimited never does).
func newMetrics(reg prometheus.Registerer) *metrics {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	m := &metrics{
		lag:      gauge("outboxd_slot_lag_bytes", "pg_current_wal_lsn() - confirmed_flush_lsn of the slot: WAL written since the position outboxd last confirmed (delivery lag in bytes)."),
		retained: gauge("outboxd_slot_retained_wal_bytes", "pg_current_wal_lsn() - restart_lsn of the slot: WAL Postgres keeps on disk for the slot (at least the lag; more while a long transaction is open)."),
		lastRead: gauge("outboxd_slot_last_read_timestamp_seconds", "When the slot's row was last read from pg_replication_slots (Unix seconds); the other outboxd_slot_* values are as of then."),
		readErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_slot_read_errors_total",
			Help: "Failed reads of the slot's row (no connection, a failed query, or no such slot); the slot metrics keep their last values."}),
		active: gauge("outboxd_slot_active", "1 when the slot is held by a process, 0 otherwise."),
		pid:    gauge("outboxd_slot_active_pid", "Process id of the walsender holding the slot (0 when none)."),
		walStatus: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_slot_wal_status", Help: "The slot's wal_status: 1 for the current value (reserved, extended, unreserved, lost).",
		}, []string{"status"}),
		safeWAL: gauge("outboxd_slot_safe_wal_size_bytes", "WAL that can still be written before the slot is in danger of being invalidated (absent when max_slot_wal_keep_size is unlimited)."),
	}
	reg.MustRegister(m.lag, m.retained, m.lastRead, m.readErrors, m.active, m.pid, m.walStatus)
	return m
}

func (m *metrics) setWALStatus(status string) {
	for _, s := range walStatuses {
		v := 0.0
		if s == status {
			v = 1
		}
		m.walStatus.WithLabelValues(s).Set(v)
	}
}
