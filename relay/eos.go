package relay

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/internal/delivery"
	"github.com/outboxd/outboxd/sink"
)

// This file is kafka.delivery: exactly_once's wiring in the relay
// (DESIGN.md, "Exactly-once mode"): the connect stage's transactional
// producer. A reshard reads the old shards' positions with
// delivery.Delivered (Shards.delivered). The
// pipeline (package internal/delivery) starts and drives exactly-once
// (delivery.Pipeline.RunExactlyOnce); package eos decides.

// producerFor returns the pipeline's producer and, in exactly-once mode,
// the run's server as conn (the run's replication connection, before
// START_REPLICATION) shows it (delivery.ReadServer): a transactional
// producer, whose id needs the server's system identifier. Nothing is
// fenced until Init. warm is what Check opened, for the first pipeline.
func (r *Relay) producerFor(ctx context.Context, conn *pgconn.PgConn, warm *Checked) (*sink.Producer, delivery.Server, error) {
	if !r.cfg.Kafka.ExactlyOnce() {
		p, err := r.producer(warm)
		return p, delivery.Server{}, err
	}
	if p := warm.TakeProducer(); p != nil { // Check warmed a plain client
		p.Close()
	}
	server, err := delivery.ReadServer(ctx, conn)
	if err != nil {
		return nil, delivery.Server{}, err
	}
	id := delivery.TransactionalID(r.cfg, r.shard, server.System)
	r.txnID = id
	producer, err := sink.NewTransactional(r.cfg.Kafka, r.sinkM, r.txnM, r.log, id)
	return producer, server, err
}
