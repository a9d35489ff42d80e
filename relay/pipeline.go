package relay

import (
	"context"

	"github.com/outboxd/outboxd/internal/delivery"
	"github.com/outboxd/outboxd/wal"
)

// pipe consumes the stream's batches in order with the run's pipeline
// (package internal/delivery): it routes inserts and messages and hands
// them to the producer, registering each with the tracker first.
func (r *Relay) pipe(ctx context.Context, batches <-chan []wal.Item, rn *pipelineRun, learnt func(schema, name string, id uint32)) error {
	// The lookups read the catalogue of the server the run streams from.
	p, err := delivery.NewPipeline(ctx, delivery.Setup{Config: r.cfg, Log: r.log, Metrics: r.m.delivery, TxnMetrics: r.txnM,
		Shard: r.shard, Window: rn.window, Timeline: rn.slot.Timeline,
		StopReading: func() {
			rn.windowEnded.Store(true) // for the drain stage
			rn.stopReading()
		},
		Tracker: rn.tracker, Producer: rn.producer, Fail: rn.fail, OutboxIDs: rn.slot.OutboxIDs, Addr: rn.slot.Addr, Schemas: rn.schemas, Per: rn.per, Learnt: learnt})
	if err != nil {
		return err
	}
	defer p.Close()
	if r.cfg.Kafka.ExactlyOnce() {
		return p.RunExactlyOnce(ctx, batches, rn.server)
	}
	return p.Run(batches)
}
