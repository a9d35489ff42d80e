package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/consumer"
)

// The processed-events table, for a migration tool; CreateTable runs the
// same statements.
func ExampleTableSQL() {
	fmt.Println(consumer.TableSQL("public.processed_events"))
	// Output:
	// CREATE TABLE IF NOT EXISTS "public"."processed_events" (
	//     consumer     text        NOT NULL,
	//     event_id     text        NOT NULL,
	//     processed_at timestamptz NOT NULL DEFAULT now(),
	//     PRIMARY KEY (consumer, event_id)
	// );
	// CREATE INDEX IF NOT EXISTS "processed_events_processed_at_idx" ON "public"."processed_events" (processed_at);
}

// A stock service reserving stock for each OrderPlaced event, once per event
// however often Kafka delivers it.
func ExampleNew() {
	reserve := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		var order struct {
			SKU string `json:"sku"`
			Qty int    `json:"qty"`
		}
		if err := json.Unmarshal(r.Value, &order); err != nil {
			return fmt.Errorf("decoding order: %w", err) // retried, then dead-lettered
		}
		_, err := tx.Exec(ctx, `UPDATE stock SET reserved = reserved + $2 WHERE sku = $1`, order.SKU, order.Qty)
		return err
	}
	run := func() error {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()
		db, err := pgxpool.New(ctx, "postgres://stock@127.0.0.1/stock")
		if err != nil {
			return err
		}
		defer db.Close()
		if err := consumer.CreateTable(ctx, db, ""); err != nil {
			return err
		}
		c, err := consumer.New(consumer.Config{
			Brokers:         []string{"127.0.0.1:9092"},
			Group:           "stock-service",
			Topics:          []string{"order-events"},
			DeadLetterTopic: "order-events-stock-dlt",
			MaxAttempts:     5,
			Retention:       14 * 24 * time.Hour,
			Logger:          slog.Default(),
		}, db, reserve)
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Run(ctx)
	}
	_ = run
}
