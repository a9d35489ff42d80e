// Command stock-service consumes order-events and reserves stock for each
// OrderPlaced event exactly once; failing events go to order-events-stock-dlt.
//
//	go run ./examples/orders/cmd/stock-service -db postgres://postgres@127.0.0.1:5432/shop -brokers 127.0.0.1:9092 -stock A-1=10,B-2=1
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/consumer"
	"github.com/outboxd/outboxd/examples/orders"
)

func main() {
	dsn := flag.String("db", "postgres://postgres@127.0.0.1:5432/postgres", "Postgres URL of the stock database")
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated Kafka brokers")
	group := flag.String("group", "stock-service", "consumer group")
	stock := flag.String("stock", "", "initial stock to upsert, sku=n,... (e.g. A-1=10,B-2=1)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dsn, strings.Split(*brokers, ","), *group, *stock); err != nil {
		fmt.Fprintln(os.Stderr, "stock-service:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dsn string, brokers []string, group, stock string) error {
	db, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := orders.StockSchema(ctx, db); err != nil {
		return fmt.Errorf("creating tables: %w", err)
	}
	if err := consumer.CreateTable(ctx, db, ""); err != nil {
		return err
	}
	for _, item := range strings.Split(stock, ",") {
		if item == "" {
			continue
		}
		sku, n, ok := strings.Cut(item, "=")
		qty, err := strconv.Atoi(n)
		if !ok || err != nil {
			return fmt.Errorf("-stock: %q is not sku=n", item)
		}
		if _, err := db.Exec(ctx, `INSERT INTO stock (sku, available) VALUES ($1, $2)
			ON CONFLICT (sku) DO UPDATE SET available = EXCLUDED.available`, sku, qty); err != nil {
			return err
		}
	}
	dlt := orders.Topic + "-stock-dlt"
	if err := orders.CreateTopic(ctx, brokers, dlt); err != nil {
		return err
	}
	c, err := consumer.New(consumer.Config{
		Brokers: brokers, Group: group, Topics: []string{orders.Topic},
		DeadLetterTopic: dlt,
		Retention:       14 * 24 * time.Hour,
		Logger:          slog.Default(),
	}, db, orders.Reserve)
	if err != nil {
		return err
	}
	defer c.Close()
	slog.Info("stock service consuming", "topic", orders.Topic, "group", group)
	return c.Run(ctx)
}
