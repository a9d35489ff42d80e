package delivery

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the pipeline's metrics, registered once per relay and shared
// by its runs.
type Metrics struct {
	changes      *prometheus.CounterVec
	transactions prometheus.Counter
	deadLettered prometheus.Counter
	commitToSend prometheus.Histogram
}

// NewMetrics returns the pipeline's metrics, registered on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		changes:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_wal_changes_total", Help: "Row changes on the outbox table and outbox messages received, by operation (inserts and messages are delivered)."}, []string{"op"}),
		transactions: prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_wal_transactions_total", Help: "Transactions received."}),
		deadLettered: prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_router_dead_lettered_total", Help: "Outbox rows that could not be routed or produced and went to the dead-letter topic."}),
		commitToSend: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "outboxd_wal_commit_to_send_seconds", Help: "Time from a transaction's commit to the walsender sending it to outboxd, both by Postgres' clock: Postgres' share of the commit → Kafka latency (decoding, waiting for a CPU, and waiting while outboxd applies backpressure or catches up).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18), // 0.5 ms to 65 s
		}),
	}
	reg.MustRegister(m.changes, m.transactions, m.deadLettered, m.commitToSend)
	for _, op := range []string{"insert", "update", "delete", "message"} {
		m.changes.WithLabelValues(op)
	}
	return m
}
