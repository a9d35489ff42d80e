package relay

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/internal/delivery"
)

type metrics struct {
	confirmedLSN  prometheus.Gauge
	confirmedAt   prometheus.Gauge
	confirmedTxns prometheus.Counter
	receivedLSN   prometheus.Gauge
	restarts      prometheus.Counter
	inFlight      prometheus.Gauge
	bufferFill    prometheus.Gauge
	roundTrip     prometheus.Histogram
	state         *prometheus.GaugeVec
	delivery      *delivery.Metrics // the pipeline's
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
		restarts:      counter("outboxd_relay_restarts_total", "Pipeline restarts after a retryable failure."),
		inFlight:      gauge("outboxd_sink_records_in_flight", "Records handed to Kafka and not yet acknowledged."),
		bufferFill:    gauge("outboxd_sink_buffer_fill_ratio", "In-flight records over kafka.max_buffered_records, or their bytes over kafka.max_buffered_bytes, whichever is larger; at 1 outboxd stops reading WAL."),
		roundTrip: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "outboxd_wal_status_round_trip_seconds", Help: "Time from a standby status update asking for a reply to the server's keepalive.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_relay_state", Help: "1 for the relay's current state: starting, streaming, standby (another process holds the slot) or stopped.",
		}, []string{"state"}),
		delivery: delivery.NewMetrics(reg),
	}
	reg.MustRegister(m.confirmedLSN, m.confirmedAt, m.confirmedTxns, m.receivedLSN,
		m.restarts, m.inFlight, m.bufferFill, m.roundTrip, m.state)
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
