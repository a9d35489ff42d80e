package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkWrite measures events per second on one connection, one
// transaction per Write, with and without batching, in both table modes.
// Without services it skips. Run it with
//
//	go test -run '^$' -bench Write ./outbox
func BenchmarkWrite(b *testing.B) {
	d := newDB(b, "outbox_bench")
	ctx := context.Background()
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	payload := []byte(`{"order_id": 42, "customer": "c-17", "total": "99.90", "lines": [{"sku": "A-1", "qty": 2}]}`)
	for _, mode := range []outbox.Mode{outbox.Insert, outbox.InsertDelete, outbox.Message} {
		w, err := outbox.New(outbox.Config{Mode: mode})
		if err != nil {
			b.Fatal(err)
		}
		for _, batch := range []int{1, 10, 100} {
			events := make([]outbox.Event, batch)
			for i := range events {
				events[i] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(i), Type: "OrderPlaced", Payload: payload}
			}
			b.Run(fmt.Sprintf("%s/batch=%d", mode, batch), func(b *testing.B) {
				for b.Loop() {
					err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
						_, err := w.Write(ctx, tx, events...)
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
			})
		}
		if _, err := conn.Exec(ctx, `TRUNCATE outbox`); err != nil {
			b.Fatal(err)
		}
	}
}
