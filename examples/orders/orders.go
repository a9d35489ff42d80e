// Package orders is the example of outboxd's README: an order service that
// writes an OrderPlaced event in the transaction that creates the order, and
// a stock service that reserves stock for each order exactly once.
//
// The commands in cmd/ run them; README.md shows the whole flow.
package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/outbox"
)

// OrderPlaced is the payload of the event of that type.
type OrderPlaced struct {
	OrderID int64  `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
}

// Topic is where outboxd routes order events (aggregate type "order").
const Topic = "order-events"

// OrderSchema creates the order service's tables: orders and the outbox.
func OrderSchema(ctx context.Context, db *pgxpool.Pool) error {
	conn, err := db.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if err := migrations.Apply(ctx, conn.Conn(), "public", "outbox"); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		sku        text NOT NULL,
		qty        int  NOT NULL CHECK (qty > 0),
		created_at timestamptz NOT NULL DEFAULT now())`)
	return err
}

// OrderService serves POST /orders.
type OrderService struct {
	DB     *pgxpool.Pool
	Outbox *outbox.Writer
	// AggregateType of the events; "" is "order", which outboxd routes to
	// Topic.
	AggregateType string
}

// ServeHTTP creates an order from {"sku": "...", "qty": n} and answers 201
// with {"order_id": ..., "event_id": "..."}.
func (s *OrderService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/orders" {
		http.Error(w, "POST /orders", http.StatusNotFound)
		return
	}
	var req struct {
		SKU string `json:"sku"`
		Qty int    `json:"qty"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.SKU == "" || req.Qty <= 0 {
		http.Error(w, `want {"sku": "...", "qty": n} with qty > 0`, http.StatusBadRequest)
		return
	}
	ev := OrderPlaced{SKU: req.SKU, Qty: req.Qty}
	aggregate := s.AggregateType
	if aggregate == "" {
		aggregate = "order"
	}
	var eventID string
	err := pgx.BeginFunc(r.Context(), s.DB, func(tx pgx.Tx) error {
		if err := tx.QueryRow(r.Context(), `INSERT INTO orders (sku, qty) VALUES ($1, $2) RETURNING id`, req.SKU, req.Qty).Scan(&ev.OrderID); err != nil {
			return fmt.Errorf("inserting order: %w", err)
		}
		payload, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		ids, err := s.Outbox.Write(r.Context(), tx, outbox.Event{
			AggregateType: aggregate, AggregateID: strconv.FormatInt(ev.OrderID, 10),
			Type: "OrderPlaced", Payload: payload,
		})
		if err != nil {
			return err
		}
		eventID = ids[0].String()
		return nil
	})
	if err != nil {
		http.Error(w, "creating order: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"order_id": ev.OrderID, "event_id": eventID})
}

// StockSchema creates the stock service's tables (the processed-events
// table comes from consumer.CreateTable).
func StockSchema(ctx context.Context, db *pgxpool.Pool) error {
	_, err := db.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS stock (
			sku       text PRIMARY KEY,
			available int  NOT NULL,
			reserved  int  NOT NULL DEFAULT 0);
		CREATE TABLE IF NOT EXISTS reservations (
			order_id bigint PRIMARY KEY,
			sku      text NOT NULL,
			qty      int  NOT NULL,
			status   text NOT NULL, -- reserved or rejected (not enough stock)
			at       timestamptz NOT NULL DEFAULT now())`)
	return err
}

// ErrUnknownSKU is a handler error: the order names no stocked item. The
// consumer retries it and then dead-letters the event.
var ErrUnknownSKU = errors.New("unknown sku")

// Reserve is the stock service's consumer.Handler: it reserves stock for an
// OrderPlaced event, or records the order as rejected when there is not
// enough. Other event types are ignored.
func Reserve(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
	for _, h := range r.Headers {
		if h.Key == "eventType" && string(h.Value) != "OrderPlaced" {
			return nil
		}
	}
	var ev OrderPlaced
	if err := json.Unmarshal(r.Value, &ev); err != nil {
		return fmt.Errorf("decoding OrderPlaced: %w", err)
	}
	tag, err := tx.Exec(ctx, `UPDATE stock SET reserved = reserved + $2 WHERE sku = $1 AND available - reserved >= $2`, ev.SKU, ev.Qty)
	if err != nil {
		return fmt.Errorf("reserving %d of %s: %w", ev.Qty, ev.SKU, err)
	}
	status := "reserved"
	if tag.RowsAffected() == 0 {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM stock WHERE sku = $1)`, ev.SKU).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return fmt.Errorf("order %d: %w %q", ev.OrderID, ErrUnknownSKU, ev.SKU)
		}
		status = "rejected"
	}
	_, err = tx.Exec(ctx, `INSERT INTO reservations (order_id, sku, qty, status) VALUES ($1, $2, $3, $4)`, ev.OrderID, ev.SKU, ev.Qty, status)
	return err
}

// CreateTopic creates a one-partition topic unless it exists, for the
// stock service's dead-letter topic.
func CreateTopic(ctx context.Context, brokers []string, topic string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, 1, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	return nil
}
