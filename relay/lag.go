package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// MonitorSlot reads the slot's row from pg_replication_slots every
// postgres.slot_lag_interval until ctx is done, for the slot metrics.
// Failures only leave the gauges at their last value; the pipeline reports
// its own errors.
func (r *Relay) MonitorSlot(ctx context.Context) error {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	tick := time.NewTicker(r.cfg.Postgres.SlotLagInterval)
	defer tick.Stop()
	safeWALRegistered := false
	for {
		if conn == nil || conn.IsClosed() {
			conn, _ = Connect(ctx, r.cfg.Postgres)
		}
		if conn != nil {
			var lag, safeWAL *int64
			var pid *int32
			var active bool
			var walStatus *string
			err := conn.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, active, active_pid, wal_status, safe_wal_size
				FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.Postgres.Slot).Scan(&lag, &active, &pid, &walStatus, &safeWAL)
			switch {
			case err == nil:
				if lag != nil {
					r.m.slotLag.Set(float64(*lag))
				}
				r.m.slotActive.Set(b2f(active))
				r.m.slotPID.Set(0)
				if pid != nil {
					r.m.slotPID.Set(float64(*pid))
				}
				if walStatus != nil {
					r.m.setWALStatus(*walStatus)
				}
				if safeWAL != nil {
					r.m.slotSafeWAL.Set(float64(*safeWAL))
					if !safeWALRegistered {
						safeWALRegistered = r.reg.Register(r.m.slotSafeWAL) == nil
					}
				}
			case ctx.Err() == nil:
				r.log.Debug("reading slot lag", "err", err, "slot", r.cfg.Postgres.Slot)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
