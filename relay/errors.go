package relay

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// IsPermanent reports whether err is one that a pipeline restart cannot fix:
// Run returns it instead of restarting.
func IsPermanent(err error) bool {
	var rowErr *router.RowError
	var layoutErr *router.LayoutError
	var decErr *wal.DecodeError
	var delivery *sink.DeliveryError
	var pgErr *pgconn.PgError
	var perm interface{ Permanent() bool } // an error that answers for itself
	switch {
	case errors.As(err, &perm) && perm.Permanent():
		return true
	case errors.As(err, &rowErr), errors.As(err, &layoutErr), errors.As(err, &decErr), errors.Is(err, errUpdate),
		errors.Is(err, wal.ErrSlotMissing), errors.Is(err, wal.ErrSlotLost), errors.Is(err, wal.ErrPublicationMissing):
		return true
	case errors.As(err, &delivery) && delivery.Rejected():
		return true
	case errors.As(err, &pgErr):
		// By SQLSTATE only. A gone slot or publication (42704, 55000) is
		// not decided here: explain reads the catalogue (judgeGone).
		switch pgErr.Code {
		case "28000", "28P01", // authentication
			"42501": // insufficient_privilege
			return true
		}
	}
	return false
}

// explain turns server errors whose meaning for the events is not obvious
// into ones that say it and what to do. It decides by SQLSTATE and, for a
// slot or publication that may be gone, by a fresh read of the catalogue
// (judgeGone) on the server at addr (the run's; any host of postgres.dsn
// when ""), never by the server's message text.
func (r *Relay) explain(ctx context.Context, err error, addr string) error {
	if r.cfg.Kafka.ExactlyOnce() {
		err = sink.AsFenced(r.txnID, err) // a record refused as fenced
	}
	var delivery *sink.DeliveryError
	if errors.As(err, &delivery) && delivery.Rejected() {
		return fmt.Errorf("%w. Kafka will refuse it again, so outboxd stopped without confirming past it; fix the record or the topic's "+
			"configuration and restart", delivery)
	}
	var pgErr *pgconn.PgError
	switch {
	case !errors.As(err, &pgErr):
		return err
	case wal.PublicationSkipped(pgErr):
		return r.publicationDropped(pgErr)
	}
	return r.judgeGone(ctx, pgErr, err, addr)
}

// publicationDropped is the stop for a publication dropped while outboxd
// used it (pgErr is what the server said).
func (r *Relay) publicationDropped(pgErr *pgconn.PgError) error {
	pg := r.cfg.Postgres
	schema, table := pg.TableName()
	create := wal.PublicationSQL(pg.Publication, schema, table)
	if r.shard.Count > 1 {
		create = shard.PublicationSQL(pg.Publication, schema, table, r.cfg.Router.KeyColumn, r.shard.Index, r.shard.Count)
	}
	return wal.Errorf(wal.ErrPublicationMissing, "publication %q was dropped while outboxd used it (%s): Postgres can no longer decode the slot, "+
		"so the events committed after the slot's confirmed position stay in the slot, undelivered but not confirmed. "+
		"Recreate it with %s and restart outboxd; transactions Postgres still cannot decode "+
		"must be recovered from the outbox table or the application before the slot is advanced past them",
		pg.Publication, pgErr.Message, create)
}

// ExitSlotGone is outboxd's exit status when the slot is missing or
// invalidated (SlotGone). A restart does not bring the slot back, and on
// timeline 1 a restarted outboxd would create a new slot at the current
// position, past every event the old one had not confirmed: service
// managers must not restart on it (deploy/systemd/outboxd.service,
// RestartPreventExitStatus).
const ExitSlotGone = 3

// SlotGone reports an error saying that the slot is missing or invalidated,
// as the error itself tells (a SlotGone() bool method: wal.ErrSlotMissing
// and wal.ErrSlotLost). A server's error is never taken for one by its text
// or code alone: explain reads pg_replication_slots afresh and turns it
// into outboxd's own, or leaves it to be retried (the next run's slot
// inspection decides).
func SlotGone(err error) bool {
	var gone interface{ SlotGone() bool }
	if errors.As(err, &gone) && gone.SlotGone() {
		return true
	}
	return errors.Is(err, wal.ErrSlotMissing) || errors.Is(err, wal.ErrSlotLost)
}
