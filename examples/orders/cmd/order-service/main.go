// Command order-service serves POST /orders: it creates an order and writes
// an OrderPlaced event to the outbox in the same transaction.
//
//	go run ./examples/orders/cmd/order-service -db postgres://postgres@127.0.0.1:5432/shop -listen 127.0.0.1:8081
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/examples/orders"
	"github.com/outboxd/outboxd/outbox"
)

func main() {
	dsn := flag.String("db", "postgres://postgres@127.0.0.1:5432/postgres", "Postgres URL of the order database (holds the outbox)")
	listen := flag.String("listen", "127.0.0.1:8081", "HTTP address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dsn, *listen); err != nil {
		fmt.Fprintln(os.Stderr, "order-service:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dsn, listen string) error {
	db, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := orders.OrderSchema(ctx, db); err != nil {
		return fmt.Errorf("creating tables: %w", err)
	}
	w, err := outbox.New(outbox.Config{Mode: outbox.InsertDelete})
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: listen, Handler: &orders.OrderService{DB: db, Outbox: w}, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	slog.Info("order service listening", "addr", listen)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
