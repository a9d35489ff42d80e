package relay

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	confirmedLSN  prometheus.Gauge
	confirmedAt   prometheus.Gauge
	confirmedTxns prometheus.Counter
	receivedLSN   prometheus.Gauge
	changes       *prometheus.CounterVec
	transactions  prometheus.Counter
	restarts      prometheus.Counter
	inFlight      prometheus.Gauge
	bufferFill    prometheus.Gauge
	deadLettered  prometheus.Counter
	roundTrip     prometheus.Histogram
	commitToSend  prometheus.Histogram
	state         *prometheus.GaugeVec
}

// states are the relay's states, exported as outboxd_relay_state.
var states = []State{StateStarting, StateStreaming, StateStandby, StateStopped}

func newMetrics(reg prometheus.Registerer) *metrics {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &metrics{
		confirmedLSN:  gauge("outboxd_checkpoint_confirmed_lsn", "WAL position last confirmed to Postgres (as a number)."),
		confirmedAt:   gauge("outboxd_checkpoint_confirmed_commit_timestamp_seconds", "Commit time of the last confirmed transaction (Unix seconds); time() minus it is the delivery lag while there is work."),
		confirmedTxns: counter("outboxd_checkpoint_transactions_confirmed_total", "Transactions confirmed to Postgres after Kafka acknowledged all their records."),
		receivedLSN:   gauge("outboxd_wal_received_lsn", "End WAL position of the last complete transaction received."),
		changes:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_wal_changes_total", Help: "Row changes on the outbox table and outbox messages received, by operation (inserts and messages are delivered)."}, []string{"op"}),
		transactions:  counter("outboxd_wal_transactions_total", "Transactions received."),
		restarts:      counter("outboxd_relay_restarts_total", "Pipeline restarts after a retryable failure."),
		inFlight:      gauge("outboxd_sink_records_in_flight", "Records handed to Kafka and not yet acknowledged."),
		bufferFill:    gauge("outboxd_sink_buffer_fill_ratio", "In-flight records over kafka.max_buffered_records, or their bytes over kafka.max_buffered_bytes, whichever is larger; at 1 outboxd stops reading WAL."),
		deadLettered:  counter("outboxd_router_dead_lettered_total", "Outbox rows that could not be routed or produced and went to the dead-letter topic."),
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
	reg.MustRegister(m.confirmedLSN, m.confirmedAt, m.confirmedTxns, m.receivedLSN,
		m.changes, m.transactions, m.restarts, m.inFlight, m.bufferFill, m.deadLettered, m.roundTrip, m.commitToSend, m.state)
	for _, op := range []string{"insert", "update", "delete", "message"} {
		m.changes.WithLabelValues(op)
	}
	m.setState(StateStarting)
	return m
}

func (m *metrics) setState(state State) {
	for _, s := range states {
		v := 0.0
		if s == state {
			v = 1
		}
		m.state.WithLabelValues(string(s)).Set(v)
	}
}
