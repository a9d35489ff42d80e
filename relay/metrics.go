package relay

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	confirmedLSN   prometheus.Gauge
	confirmedAt    prometheus.Gauge
	confirmedTxns  prometheus.Counter
	receivedLSN    prometheus.Gauge
	slotLag        prometheus.Gauge
	slotRetained   prometheus.Gauge
	slotLastRead   prometheus.Gauge
	slotReadErrors prometheus.Counter
	slotActive     prometheus.Gauge
	slotPID        prometheus.Gauge
	slotWALStatus  *prometheus.GaugeVec
	slotSafeWAL    prometheus.Gauge
	changes        *prometheus.CounterVec
	transactions   prometheus.Counter
	restarts       prometheus.Counter
	inFlight       prometheus.Gauge
	bufferFill     prometheus.Gauge
	deadLettered   prometheus.Counter
	roundTrip      prometheus.Histogram
	commitToSend   prometheus.Histogram
	state          *prometheus.GaugeVec
}

// walStatuses are the values of pg_replication_slots.wal_status.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// states are the relay's states, exported as outboxd_relay_state.
var states = []string{stateStarting, stateStreaming, stateStandby, stateStopped}

func newMetrics(reg prometheus.Registerer) *metrics {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &metrics{
		confirmedLSN:   gauge("outboxd_checkpoint_confirmed_lsn", "WAL position last confirmed to Postgres (as a number)."),
		confirmedAt:    gauge("outboxd_checkpoint_confirmed_commit_timestamp_seconds", "Commit time of the last confirmed transaction (Unix seconds); time() minus it is the delivery lag while there is work."),
		confirmedTxns:  counter("outboxd_checkpoint_transactions_confirmed_total", "Transactions confirmed to Postgres after Kafka acknowledged all their records."),
		receivedLSN:    gauge("outboxd_wal_received_lsn", "End WAL position of the last complete transaction received."),
		slotLag:        gauge("outboxd_slot_lag_bytes", "pg_current_wal_lsn() - confirmed_flush_lsn of the slot: WAL written since the position outboxd last confirmed (delivery lag in bytes)."),
		slotRetained:   gauge("outboxd_slot_retained_wal_bytes", "pg_current_wal_lsn() - restart_lsn of the slot: WAL Postgres keeps on disk for the slot (at least the lag; more while a long transaction is open)."),
		slotLastRead:   gauge("outboxd_slot_last_read_timestamp_seconds", "When the slot's row was last read from pg_replication_slots (Unix seconds); the other outboxd_slot_* values are as of then."),
		slotReadErrors: counter("outboxd_slot_read_errors_total", "Failed reads of the slot's row (no connection, a failed query, or no such slot); the slot metrics keep their last values."),
		slotActive:     gauge("outboxd_slot_active", "1 when the slot is held by a process, 0 otherwise."),
		slotPID:        gauge("outboxd_slot_active_pid", "Process id of the walsender holding the slot (0 when none)."),
		slotWALStatus: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_slot_wal_status", Help: "The slot's wal_status: 1 for the current value (reserved, extended, unreserved, lost).",
		}, []string{"status"}),
		slotSafeWAL:  gauge("outboxd_slot_safe_wal_size_bytes", "WAL that can still be written before the slot is in danger of being invalidated (absent when max_slot_wal_keep_size is unlimited)."),
		changes:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_wal_changes_total", Help: "Row changes on the outbox table and outbox messages received, by operation (inserts and messages are delivered)."}, []string{"op"}),
		transactions: counter("outboxd_wal_transactions_total", "Transactions received."),
		restarts:     counter("outboxd_relay_restarts_total", "Pipeline restarts after a retryable failure."),
		inFlight:     gauge("outboxd_sink_records_in_flight", "Records handed to Kafka and not yet acknowledged."),
		bufferFill:   gauge("outboxd_sink_buffer_fill_ratio", "In-flight records over kafka.max_buffered_records, or their bytes over kafka.max_buffered_bytes, whichever is larger; at 1 outboxd stops reading WAL."),
		deadLettered: counter("outboxd_router_dead_lettered_total", "Outbox rows that could not be routed or produced and went to the dead-letter topic."),
		roundTrip: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "outboxd_wal_status_round_trip_seconds", Help: "Time from a standby status update asking for a reply to the server's keepalive.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		commitToSend: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "outboxd_wal_commit_to_send_seconds", Help: "Time from a transaction's commit to the walsender sending it to outboxd, both by Postgres' clock: Postgres' share of the commit → Kafka latency (decoding, waiting for a CPU, and waiting while outboxd applies backpressure or catches up).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18), // 0.5 ms to 65 s
		}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_relay_state", Help: "1 for the relay's current state: starting, streaming, standby (another process holds the slot) or stopped.",
		}, []string{"state"}),
	}
	reg.MustRegister(m.confirmedLSN, m.confirmedAt, m.confirmedTxns, m.receivedLSN, m.slotLag, m.slotRetained, m.slotLastRead, m.slotReadErrors, m.slotActive, m.slotPID,
		m.slotWALStatus, m.changes, m.transactions, m.restarts, m.inFlight, m.bufferFill, m.deadLettered, m.roundTrip, m.commitToSend, m.state)
	for _, op := range []string{"insert", "update", "delete", "message"} {
		m.changes.WithLabelValues(op)
	}
	m.setState(stateStarting)
	return m
}

func (m *metrics) setState(state string) {
	for _, s := range states {
		v := 0.0
		if s == state {
			v = 1
		}
		m.state.WithLabelValues(s).Set(v)
	}
}

func (m *metrics) setWALStatus(status string) {
	for _, s := range walStatuses {
		v := 0.0
		if s == status {
			v = 1
		}
		m.slotWALStatus.WithLabelValues(s).Set(v)
	}
}
