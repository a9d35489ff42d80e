// Command gopqcdc is the benchmark's go_pq_cdc_kafka contender: Trendyol's
// go-pq-cdc-kafka, from its published module at the release go.mod pins,
// with a handler that routes each outbox row as outboxd and Debezium's
// EventRouter do: topic <aggregate_type>-events, key aggregate_id, value the
// payload column, headers id and eventType (the harness joins its latencies
// by the id header). It lives in a module of its own so that its
// dependencies stay out of outboxd's go.mod.
//
// Settings are those the project's README and production tutorial give:
// the harness's slot and publication (made beforehand, as the tutorial
// recommends), a batch ticker of 200 ms and the default batch of 2,000
// messages or 1 MB. Two choices are the harness's, for equal terms with the
// other contenders: acks from every in-sync replica (one broker here, so no
// extra round trip) and Kafka's murmur2 partitioner, so that every key lands
// on the partition the Java clients and franz-go choose.
package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	cdc "github.com/Trendyol/go-pq-cdc-kafka"
	"github.com/Trendyol/go-pq-cdc-kafka/config"
	cdcconfig "github.com/Trendyol/go-pq-cdc/config"
	"github.com/Trendyol/go-pq-cdc/pq/publication"
	"github.com/Trendyol/go-pq-cdc/pq/slot"
	gokafka "github.com/segmentio/kafka-go"
)

func main() {
	var (
		host        = flag.String("host", "127.0.0.1", "Postgres host")
		port        = flag.Int("port", 5432, "Postgres port")
		user        = flag.String("user", "postgres", "Postgres user")
		password    = flag.String("password", "unused", "Postgres password (go-pq-cdc requires one, trust auth ignores it)")
		database    = flag.String("database", "postgres", "Postgres database")
		slotName    = flag.String("slot", "", "replication slot (made by the harness)")
		pub         = flag.String("publication", "bench", "publication (made by the harness)")
		brokers     = flag.String("brokers", "127.0.0.1:9092", "Kafka bootstrap broker")
		metricsPort = flag.Int("metrics-port", 28081, "port of go-pq-cdc's HTTP API (/metrics, /status)")
		ticker      = flag.Duration("batch-ticker", 200*time.Millisecond, "producerBatchTickerDuration")
	)
	flag.Parse()
	if *slotName == "" {
		fmt.Fprintln(os.Stderr, "gopqcdc: -slot is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := config.Connector{
		CDC: cdcconfig.Config{
			Host:        *host,
			Port:        *port,
			Username:    *user,
			Password:    *password,
			Database:    *database,
			Publication: publication.Config{Name: *pub},
			Slot:        slot.Config{Name: *slotName, SlotActivityCheckerInterval: 3000},
			Metric:      cdcconfig.MetricConfig{Port: *metricsPort},
			Logger:      cdcconfig.LoggerConfig{LogLevel: slog.LevelWarn},
		},
		Kafka: config.Kafka{
			Brokers:                     []string{*brokers},
			ProducerBatchTickerDuration: *ticker,
			RequiredAcks:                -1,
			Balancer:                    "Murmur2Balancer",
		},
	}
	connector, err := cdc.NewConnector(ctx, cfg, route)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gopqcdc: %v\n", err)
		os.Exit(1)
	}
	defer connector.Close()
	connector.Start(ctx)
}

// route turns an outbox insert into its event; other changes go nowhere.
func route(msg *cdc.Message) []gokafka.Message {
	if !msg.Type.IsInsert() {
		return nil
	}
	row := msg.NewData
	aggType, _ := row["aggregate_type"].(string)
	aggID, _ := row["aggregate_id"].(string)
	eventType, _ := row["event_type"].(string)
	value, err := json.Marshal(row["payload"]) // jsonb arrives decoded
	if err != nil {                            // the handler cannot return an error: stop rather than drop the event
		fmt.Fprintf(os.Stderr, "gopqcdc: encoding the payload of event %s: %v\n", uuidText(row["id"]), err)
		os.Exit(1)
	}
	return []gokafka.Message{{
		Topic: aggType + "-events",
		Key:   []byte(aggID),
		Value: value,
		Headers: []gokafka.Header{
			{Key: "id", Value: []byte(uuidText(row["id"]))},
			{Key: "eventType", Value: []byte(eventType)},
		},
	}}
}

// uuidText formats a uuid column as Postgres prints it.
func uuidText(v any) string {
	switch u := v.(type) {
	case [16]byte:
		h := hex.EncodeToString(u[:])
		return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	case string:
		return u
	}
	return fmt.Sprint(v)
}
