package relay

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/internal/backfill"
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

// backfillTransactions returns, for an exactly-once backfill that
// backfill.Open has locked, the slot's transactional producer (the id the
// stream's runs use), initialised: Kafka aborts the transaction the id's
// previous holder left open and fences it (delivery.Fence, which first
// refuses another deployment's id). It returns too what the id last
// committed, read after that. The system identifier, which the id and the
// positions carry, is IDENTIFY_SYSTEM's on a replication connection opened
// and closed here: the backfill holds no walsender while it sends.
func (r *Relay) backfillTransactions(ctx context.Context) (_ *sink.Producer, _ backfill.Committed, err error) {
	conn, err := r.check.ConnectReplication(ctx)
	if err != nil {
		return nil, backfill.Committed{}, err
	}
	server, err := delivery.ReadServer(ctx, conn)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return nil, backfill.Committed{}, err
	}
	id := delivery.TransactionalID(r.cfg, r.shard, server.System)
	r.txnID = id
	p, err := sink.NewTransactional(r.cfg.Kafka, r.sinkM, r.txnM, r.log, id)
	if err != nil {
		return nil, backfill.Committed{}, err
	}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	owner := delivery.PositionOwner(r.cfg, id, server.System)
	if err := delivery.Fence(ctx, p, owner); err != nil {
		return nil, backfill.Committed{}, err
	}
	pos, found, err := delivery.ReadPosition(ctx, p.ReadPosition, owner)
	if err != nil {
		return nil, backfill.Committed{}, err
	}
	return p, backfill.Committed{Owner: owner, Position: pos, Found: found, Server: server.Server}, nil
}
