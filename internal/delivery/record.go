package delivery

import (
	"context"
	"fmt"
	"slices"

	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/dlq"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/wal"
)

// Producer is what a pipeline uses of *sink.Producer: Produce hands rec
// over, or returns why it could not (done is then never called); once
// handed over, done is called once with the outcome, from another
// goroutine. Produce keeps no reference to rec once it returns.
type Producer interface {
	Produce(ctx context.Context, rec *router.Record, done func(error)) error
}

// MessageKey returns a logical message's key field, named as the key
// column, as the router reads it before router.key_encoding
// (router.MessageFields.Text). keyed is false when the content is not a JSON
// object or the field is missing or null.
func MessageKey(content []byte, field string) (key []byte, keyed bool) {
	fields, err := router.ParseMessage(&wal.Message{Content: content})
	if err != nil {
		return nil, false
	}
	return fields.Text(field)
}

// DeadLetter builds the dead-letter record for a poison row of the outbox
// table whose configuration cfg is (config.Config.PerTable: its
// router.poison.dlq_topic, router.id_header and router.event_type_header):
// its key and payload as they were (the payload is dropped if it alone is
// too large), its id and event type headers, and headers saying why, where
// from and under which header names (internal/dlq's Header*).
func DeadLetter(cfg config.Config, p *router.RowError) *router.Record {
	// A dead letter must fit where the original did not: it keeps the
	// original's headers and payload within half of max_message_bytes,
	// and says what it dropped.
	limit := cfg.Kafka.MaxMessageBytes / 2
	headers := p.Headers
	size := len(p.Key)
	for _, h := range headers {
		size += len(h.Key) + len(h.Value)
	}
	var dropped []router.Header
	if headers == nil { // refused by routing: no record was built (dlq refuses to redrive it)
		dropped = append(dropped, router.Header{Key: dlq.HeaderUnbuilt, Value: []byte("the key and value are the row's columns; only the id and event type headers are kept")})
	}
	if headers == nil || size > limit {
		if headers != nil {
			dropped = append(dropped, router.Header{Key: dlq.HeaderHeadersDropped, Value: []byte(fmt.Sprintf(
				"%d headers of %d bytes: a dead letter keeps headers and payload within half of kafka.max_message_bytes (%d); the id and event type are kept",
				len(headers), size-len(p.Key), limit))})
		}
		// So that the row can be replayed as it was: its id and event type.
		headers = []router.Header{{Key: cfg.Router.IDHeader, Value: []byte(p.EventID)}}
		if p.EventType != "" {
			headers = append(headers, router.Header{Key: cfg.Router.EventTypeHeader, Value: []byte(p.EventType)})
		}
		size = len(p.Key) + len(cfg.Router.IDHeader) + len(p.EventID) + len(cfg.Router.EventTypeHeader) + len(p.EventType)
	}
	value := p.Value
	if len(value)+size > limit {
		value = nil
		dropped = append(dropped, router.Header{Key: dlq.HeaderPayloadDropped, Value: []byte(fmt.Sprintf(
			"%d bytes: a dead letter keeps the payload only within half of kafka.max_message_bytes (%d); the outbox row, or the application, has it",
			len(p.Value), limit))})
	}
	rec := &router.Record{Topic: cfg.Router.Poison.DLQTopic, Key: p.Key, Value: value, EventID: p.EventID, Partition: -1}
	rec.Headers = append(slices.Clip(headers),
		router.Header{Key: dlq.HeaderReason, Value: []byte(p.Reason)},
		router.Header{Key: dlq.HeaderSourceLSN, Value: []byte(p.LSN.String())},
		router.Header{Key: dlq.HeaderSourceTable, Value: []byte(p.Table)},
		router.Header{Key: dlq.HeaderIntendedTopic, Value: []byte(p.Topic)},
		// The header names of the row's table: they may differ per table,
		// and outboxd dlq reads the event id by the one recorded here.
		router.Header{Key: dlq.HeaderIDHeader, Value: []byte(cfg.Router.IDHeader)},
		router.Header{Key: dlq.HeaderEventTypeHeader, Value: []byte(cfg.Router.EventTypeHeader)},
	)
	rec.Headers = append(rec.Headers, dropped...)
	return rec
}

// Produce registers rec with txn and hands it to the producer; done is
// txn's callback (fails the run, or acknowledges one record of txn).
func Produce(ctx context.Context, txn *checkpoint.Txn, rec *router.Record, producer Producer, done func(error)) error {
	txn.Add()
	err := producer.Produce(ctx, rec, done)
	if err != nil {
		txn.Ack() // never handed over: nothing to wait for, and the run stops or dead-letters it
	}
	return err
}

// LastCommit returns the index of batch's last Commit, or -1.
func LastCommit(batch []wal.Item) int {
	for i := len(batch) - 1; i >= 0; i-- {
		if _, ok := batch[i].(*wal.Commit); ok {
			return i
		}
	}
	return -1
}
