package relay

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	confirmedLSN prometheus.Gauge
	receivedLSN  prometheus.Gauge
	slotLag      prometheus.Gauge
	slotActive   prometheus.Gauge
	changes      *prometheus.CounterVec
	transactions prometheus.Counter
	restarts     prometheus.Counter
	inFlight     prometheus.Gauge
	deadLettered prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		confirmedLSN: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_checkpoint_confirmed_lsn", Help: "WAL position last confirmed to Postgres (as a number).",
		}),
		receivedLSN: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_wal_received_lsn", Help: "End WAL position of the last complete transaction received.",
		}),
		slotLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_slot_lag_bytes", Help: "pg_current_wal_lsn() - confirmed_flush_lsn of the slot: WAL Postgres retains for outboxd.",
		}),
		slotActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_slot_active", Help: "1 when the slot is held by a process, 0 otherwise.",
		}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_wal_changes_total", Help: "Row changes on the outbox table and outbox messages received, by operation (inserts and messages are delivered).",
		}, []string{"op"}),
		transactions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_wal_transactions_total", Help: "Transactions received.",
		}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_relay_restarts_total", Help: "Pipeline restarts after a retryable failure.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_sink_records_in_flight", Help: "Records handed to Kafka and not yet acknowledged.",
		}),
		deadLettered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_router_dead_lettered_total", Help: "Outbox rows that could not be routed or produced and went to the dead-letter topic.",
		}),
	}
	reg.MustRegister(m.deadLettered, m.confirmedLSN, m.receivedLSN, m.slotLag, m.slotActive, m.changes, m.transactions, m.restarts, m.inFlight)
	for _, op := range []string{"insert", "update", "delete", "message"} {
		m.changes.WithLabelValues(op)
	}
	return m
}
