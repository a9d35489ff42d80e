package delivery

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the pipeline's metrics, registered once per relay and shared
// by its runs.
type Metrics struct {
	changes      *prometheus.CounterVec
	transactions prometheus.Counter
	deadLettered *prometheus.CounterVec
	commitToSend prometheus.Histogram
}

// NewMetrics returns the pipeline's metrics, registered on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_wal_changes_total",
			Help: "Row changes on the outbox tables and outbox messages received, by operation (inserts and messages are delivered) and outbox table (\"\" for messages that name none of this outboxd's tables)."}, []string{"op", "table"}),
		transactions: prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_wal_transactions_total", Help: "Transactions received."}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_router_dead_lettered_total",
			Help: "Outbox rows that could not be routed or produced and went to the dead-letter topic, by outbox table."}, []string{"table"}),
		commitToSend: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "outboxd_wal_commit_to_send_seconds", Help: "Time from a transaction's commit to the walsender sending it to outboxd, both by Postgres' clock: Postgres' share of the commit → Kafka latency (decoding, waiting for a CPU, and waiting while outboxd applies backpressure or catches up).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18), // 0.5 ms to 65 s
		}),
	}
	reg.MustRegister(m.changes, m.transactions, m.deadLettered, m.commitToSend)
	for _, op := range untabled {
		m.changes.WithLabelValues(op, "")
	}
	return m
}

// untabled are the ops of outboxd_wal_changes_total counted without a table:
// messages that no outbox table of this outboxd routes.
var untabled = []string{"message_nontransactional", "message_other_outbox", "message_unowned"}

// counts are one outbox table's series of the pipeline's metrics, labelled
// with its name: a label value per listed table (postgres.table or
// postgres.tables), so the series stay as few as the tables.
type counts struct {
	inserts, updates, deletes, messages, deadLettered prometheus.Counter
}

// table returns the series of outbox table name, created at zero.
func (m *Metrics) table(name string) counts {
	return counts{
		inserts: m.changes.WithLabelValues("insert", name), updates: m.changes.WithLabelValues("update", name),
		deletes: m.changes.WithLabelValues("delete", name), messages: m.changes.WithLabelValues("message", name),
		deadLettered: m.deadLettered.WithLabelValues(name),
	}
}
