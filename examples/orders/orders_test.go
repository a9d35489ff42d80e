package orders_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testenv/daemon"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/consumer"
	"github.com/outboxd/outboxd/examples/orders"
	"github.com/outboxd/outboxd/outbox"
)

// The README's flow: POST an order, outboxd delivers OrderPlaced, the stock
// service reserves stock, rejects an order it cannot fill and dead-letters
// one for an unknown item.
func TestOrderFlow(t *testing.T) {
	_, brokers := testenv.Services(t)
	ctx := context.Background()
	log := testenv.Logger(t)

	// One database for both services, as in the README.
	name, dsn := testenv.NewDatabase(t, "orders")
	db, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if err := orders.OrderSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := orders.StockSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := consumer.CreateTable(ctx, db, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO stock (sku, available) VALUES ('A-1', 3)`); err != nil {
		t.Fatal(err)
	}

	// outboxd, started as production starts it.
	cfg := daemon.Config(dsn, name, brokers)
	daemon.Start(t, cfg)

	// The order service.
	aggregate := "order_" + testenv.RandomSuffix()
	topic := aggregate + "-events"
	w, err := outbox.New(outbox.Config{Mode: outbox.InsertDelete})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(&orders.OrderService{DB: db, Outbox: w, AggregateType: aggregate})
	t.Cleanup(srv.Close)
	post := func(body string) string {
		t.Helper()
		resp, err := http.Post(srv.URL+"/orders", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			EventID string `json:"event_id"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST %s: %s %v", body, resp.Status, err)
		}
		return out.EventID
	}
	post(`{"sku": "A-1", "qty": 2}`)
	post(`{"sku": "A-1", "qty": 2}`)
	unknown := post(`{"sku": "NOPE", "qty": 1}`)

	// The stock service.
	dlt := topic + "-stock-dlt"
	if err := orders.CreateTopic(ctx, cfg.Kafka.Brokers, dlt); err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Brokers: cfg.Kafka.Brokers, Group: "stock-" + testenv.RandomSuffix(), Topics: []string{topic},
		DeadLetterTopic: dlt, MaxAttempts: 2, Backoff: 10 * time.Millisecond, Logger: log.With("component", "stock"),
		KafkaOpts: []kgo.Opt{kgo.MetadataMinAge(250 * time.Millisecond), kgo.FetchMaxWait(200 * time.Millisecond)},
	}, db, orders.Reserve)
	if err != nil {
		t.Fatal(err)
	}
	cctx, stopConsumer := context.WithCancel(ctx)
	consumerDone := make(chan error, 1)
	go func() { consumerDone <- c.Run(cctx) }()
	defer func() {
		stopConsumer()
		if err := <-consumerDone; err != nil {
			t.Errorf("stock consumer: %v", err)
		}
		c.Close()
	}()

	// Two reservations (one reserved, one rejected) and one dead letter.
	deadline := time.Now().Add(30 * time.Second)
	var got string
	for time.Now().Before(deadline) {
		rows, err := db.Query(ctx, `SELECT sku || ':' || qty || ':' || status FROM reservations ORDER BY status DESC`)
		if err != nil {
			t.Fatal(err)
		}
		list, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if got = strings.Join(list, ","); len(list) == 2 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got != "A-1:2:reserved,A-1:2:rejected" {
		t.Fatalf("reservations %q; want A-1:2:reserved,A-1:2:rejected", got)
	}
	var reserved int
	if err := db.QueryRow(ctx, `SELECT reserved FROM stock WHERE sku = 'A-1'`).Scan(&reserved); err != nil || reserved != 2 {
		t.Errorf("A-1 reserved = %d (%v); want 2", reserved, err)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Kafka.Brokers...), kgo.ConsumeTopics(dlt),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(250*time.Millisecond), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var dead []*kgo.Record
	for len(dead) == 0 && fctx.Err() == nil {
		dead = append(dead, cl.PollFetches(fctx).Records()...)
	}
	if len(dead) != 1 {
		t.Fatalf("%d dead letters; want 1", len(dead))
	}
	h := map[string][]byte{}
	for _, hd := range dead[0].Headers {
		h[hd.Key] = hd.Value
	}
	if string(h["id"]) != unknown || !bytes.Contains(h[consumer.HeaderError], []byte(`unknown sku "NOPE"`)) {
		t.Errorf("dead letter id %s error %q; want id %s and an unknown sku error", h["id"], h[consumer.HeaderError], unknown)
	}
}
