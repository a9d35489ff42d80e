package config_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/config"
)

func TestDefaultValidates(t *testing.T) {
	if err := config.Default().Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	cfg, err := config.Load("", nil)
	if err != nil {
		t.Fatalf("Load(\"\", nil) = %v", err)
	}
	if !reflect.DeepEqual(cfg, config.Default()) {
		t.Errorf("Load without file or environment differs from Default():\n got %+v\nwant %+v", cfg, config.Default())
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "outboxd.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadFile(t *testing.T) {
	path := writeFile(t, `
postgres:
  dsn: postgres://app@db.internal:5432/shop
  slot: shop_outbox
  table: sales.outbox
  create_slot: false
  status_interval: 250ms
kafka:
  brokers: [k1:9092, "k2:9092"]
  topic_partitions: 12
  linger: 5ms
  compression: zstd
router:
  topic_template: shop.${routedByValue}
  event_type_column: ""
log:
  level: debug
shutdown_timeout: 1m30s
`)
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Default()
	want.Postgres.DSN = "postgres://app@db.internal:5432/shop"
	want.Postgres.Slot = "shop_outbox"
	want.Postgres.Table = "sales.outbox"
	want.Postgres.CreateSlot = false
	want.Postgres.StatusInterval = 250 * time.Millisecond
	want.Kafka.Brokers = []string{"k1:9092", "k2:9092"}
	want.Kafka.TopicPartitions = 12
	want.Kafka.Linger = 5 * time.Millisecond
	want.Kafka.Compression = "zstd"
	want.Router.TopicTemplate = "shop.${routedByValue}"
	want.Router.EventTypeColumn = ""
	want.Log.Level = "debug"
	want.ShutdownTimeout = 90 * time.Second
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("Load:\n got %+v\nwant %+v", cfg, want)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
	if schema, table := cfg.Postgres.TableName(); schema != "sales" || table != "outbox" {
		t.Errorf("TableName() = %q, %q", schema, table)
	}
}

func TestLoadEmptyFile(t *testing.T) {
	for _, content := range []string{"", "\n", "# only a comment\n", "---\n"} {
		cfg, err := config.Load(writeFile(t, content), nil)
		if err != nil {
			t.Errorf("Load(%q) = %v", content, err)
			continue
		}
		if !reflect.DeepEqual(cfg, config.Default()) {
			t.Errorf("Load(%q) changed the defaults: %+v", content, cfg)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := config.Load(filepath.Join(t.TempDir(), "nope.yaml"), nil)
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("Load(missing file) = %v, want an error naming the file", err)
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // substrings of the error
	}{
		{"unknown top-level key", "postgress:\n  dsn: x\n", []string{"postgress", "line 1"}},
		{"unknown nested key", "postgres:\n  slot: a\n  tabel: public.outbox\n", []string{"line 3", "unknown setting postgres.tabel (did you mean postgres.table?)"}},
		{"unknown key two levels down", "kafka:\n  tls:\n    ca: x\n", []string{"unknown setting kafka.tls.ca"}},
		{"unknown key in a list item", "router:\n  additional_fields:\n    - {colum: a, placement: header}\n", []string{"unknown setting router.additional_fields.colum (did you mean router.additional_fields.column?)"}},
		{"unknown key in kafka", "kafka:\n  acks: all\n", []string{"acks"}},
		{"string for int", "kafka:\n  topic_partitions: six\n", []string{"six", "int"}},
		{"bare int for duration", "postgres:\n  status_interval: 5\n", []string{"line 2", "postgres.status_interval: 5 has no unit; write 5s"}},
		{"bare int for a nested duration", "kafka:\n  brokers: [a:1]\n  linger: 2\n", []string{"line 3", "kafka.linger: 2 has no unit; write 2s"}},
		{"bad duration", "kafka:\n  linger: soon\n", []string{"soon"}},
		{"bad bool", "postgres:\n  create_slot: maybe\n", []string{"maybe", "bool"}},
		{"map for string", "postgres:\n  dsn: {host: h}\n", []string{"string"}},
		{"list for section", "postgres: [a, b]\n", []string{"config.Postgres"}},
		{"scalar for list", "kafka:\n  brokers: {a: 1}\n", []string{"[]string"}},
		{"not yaml", "postgres: [\n", []string{"line"}},
		{"tab indentation", "postgres:\n\tslot: a\n", []string{"line"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			err := config.Decode([]byte(tt.yaml), &cfg)
			if err == nil {
				t.Fatalf("Decode(%q) succeeded: %+v", tt.yaml, cfg)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "yaml: ") {
				t.Errorf("error %q still carries the yaml: prefix", err)
			}
			// Through Load, the error also names the file.
			path := writeFile(t, tt.yaml)
			if _, err := config.Load(path, nil); err == nil || !strings.Contains(err.Error(), path) {
				t.Errorf("Load = %v, want an error naming %s", err, path)
			}
		})
	}
}

func TestEnvOverrides(t *testing.T) {
	path := writeFile(t, "postgres:\n  slot: from_file\n  publication: from_file\nkafka:\n  brokers: [file:1]\n")
	env := []string{
		"PATH=/usr/bin",
		"HOME=/root",
		"OUTBOX_SLOT=ignored", // not our prefix
		"OUTBOXD_POSTGRES_DSN=host=db user=app password=secret",
		"OUTBOXD_POSTGRES_SLOT=from_env",
		"OUTBOXD_KAFKA_BROKERS=a:1,b:2",
		"OUTBOXD_POSTGRES_STATUS_INTERVAL=2s",
		"OUTBOXD_KAFKA_LINGER=10ms",
		"OUTBOXD_POSTGRES_CREATE_SLOT=false",
		"OUTBOXD_POSTGRES_CREATE_PUBLICATION=0",
		"OUTBOXD_KAFKA_TOPIC_PARTITIONS=3",
		"OUTBOXD_KAFKA_TOPIC_REPLICATION_FACTOR=-1",
		"OUTBOXD_ROUTER_TOPIC_TEMPLATE=x.${routedByValue}",
		"OUTBOXD_ROUTER_EVENT_TYPE_COLUMN=",
		"OUTBOXD_ROUTER_ON_UPDATE=error",
		"OUTBOXD_HTTP_LISTEN=127.0.0.1:9000",
		"OUTBOXD_LOG_FORMAT=json",
		"OUTBOXD_SHUTDOWN_TIMEOUT=3s",
		"OUTBOXD_TEST_PG_DSN=whatever",
		"OUTBOXD_TESTBED=1",
	}
	cfg, err := config.Load(path, env)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Default()
	want.Postgres.DSN = "host=db user=app password=secret"
	want.Postgres.Slot = "from_env"
	want.Postgres.Publication = "from_file" // the file applies where the environment is silent
	want.Kafka.Brokers = []string{"a:1", "b:2"}
	want.Postgres.StatusInterval = 2 * time.Second
	want.Kafka.Linger = 10 * time.Millisecond
	want.Postgres.CreateSlot = false
	want.Postgres.CreatePublication = false
	want.Kafka.TopicPartitions = 3
	want.Kafka.TopicReplicationFactor = -1
	want.Router.TopicTemplate = "x.${routedByValue}"
	want.Router.EventTypeColumn = ""
	want.Router.OnUpdate = config.OnUpdateError
	want.HTTP.Listen = "127.0.0.1:9000"
	want.Log.Format = "json"
	want.ShutdownTimeout = 3 * time.Second
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("Load:\n got %+v\nwant %+v", cfg, want)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
}

func TestEnvBrokerList(t *testing.T) {
	tests := map[string][]string{
		"a:1":            {"a:1"},
		"a:1,b:2":        {"a:1", "b:2"},
		" a:1 , b:2 ,,":  {"a:1", "b:2"},
		"":               nil,
		"[::1]:9092,c:3": {"[::1]:9092", "c:3"},
	}
	for value, want := range tests {
		cfg, err := config.Load("", []string{"OUTBOXD_KAFKA_BROKERS=" + value})
		if err != nil {
			t.Fatalf("%q: %v", value, err)
		}
		if !reflect.DeepEqual(cfg.Kafka.Brokers, want) {
			t.Errorf("OUTBOXD_KAFKA_BROKERS=%q gave %q, want %q", value, cfg.Kafka.Brokers, want)
		}
	}
	// An empty list is caught by Validate.
	cfg, _ := config.Load("", []string{"OUTBOXD_KAFKA_BROKERS="})
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "kafka.brokers") {
		t.Errorf("Validate() with no brokers = %v", err)
	}
}

// A single string where a list of strings goes is a list, split on commas as
// in the environment; nothing else about the file changes.
func TestDecodeStringAsList(t *testing.T) {
	for yml, want := range map[string][]string{
		"kafka:\n  brokers: k1:9092\n  client_id: c\n":              {"k1:9092"},
		"kafka:\n  brokers: \"k1:9092, k2:9092\"\n  client_id: c\n": {"k1:9092", "k2:9092"},
		"kafka:\n  brokers: [k1:9092]\n  client_id: c\n":            {"k1:9092"},
	} {
		cfg := config.Default()
		if err := config.Decode([]byte(yml), &cfg); err != nil {
			t.Fatalf("%q: %v", yml, err)
		}
		if !reflect.DeepEqual(cfg.Kafka.Brokers, want) || cfg.Kafka.ClientID != "c" {
			t.Errorf("%q gave brokers %q, client_id %q; want %q, c", yml, cfg.Kafka.Brokers, cfg.Kafka.ClientID, want)
		}
	}
	cfg := config.Default()
	err := config.Decode([]byte("kafka:\n  brokers: k1:9092\n  acks: all\n"), &cfg)
	if err == nil || !strings.Contains(err.Error(), "unknown setting kafka.acks") {
		t.Errorf("an unknown key beside a string list: %v, want it named", err)
	}
}

// A connection string that does not parse is named with what is wrong in it,
// never with its password.
func TestDSNErrorsSayWhatIsWrong(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://u:s3cret@host:99999/db":          "invalid port",
		"postgres://u:s3cret@host/db?sslmode=bogus":  "sslmode is invalid",
		"postgres://u:s3%zzcret@h/db":                "invalid percent-encoded token in password",
		"host=h password='s3cret":                    "unterminated quoted string",
		"postgres://u:s3cret@h/db?connect_timeout=x": "invalid connect_timeout",
	} {
		cfg := config.Default()
		cfg.Postgres.DSN = dsn
		err := cfg.Validate()
		if err == nil {
			t.Fatalf("Validate with DSN %q: no error", dsn)
		}
		if msg := err.Error(); !strings.Contains(msg, want) || strings.Contains(msg, "s3cret") || strings.Contains(msg, "zzcret") {
			t.Errorf("DSN %q: error %q; want it to say %q and not show the password", dsn, msg, want)
		}
	}
}

func TestEnvErrors(t *testing.T) {
	tests := []struct {
		env  string
		want []string
	}{
		{"OUTBOXD_POSTGRES_SLOTT=x", []string{"OUTBOXD_POSTGRES_SLOTT", "names no setting", "did you mean OUTBOXD_POSTGRES_SLOT?"}},
		{"OUTBOXD_KAFKA_BROKER=x", []string{"did you mean OUTBOXD_KAFKA_BROKERS?"}},
		{"OUTBOXD_DSN=x", []string{"OUTBOXD_DSN", "names no setting"}},
		{"OUTBOXD_POSTGRES=x", []string{"OUTBOXD_POSTGRES", "names no setting"}},
		{"OUTBOXD_=x", []string{"OUTBOXD_", "names no setting"}},
		{"OUTBOXD_postgres_slot=x", []string{"OUTBOXD_postgres_slot"}},
		{"OUTBOXD_POSTGRES_STATUS_INTERVAL=5", []string{"OUTBOXD_POSTGRES_STATUS_INTERVAL", `"5" has no unit; write 5s`}},
		{"OUTBOXD_KAFKA_LINGER=fast", []string{"OUTBOXD_KAFKA_LINGER", "fast"}},
		{"OUTBOXD_POSTGRES_CREATE_SLOT=yes", []string{"OUTBOXD_POSTGRES_CREATE_SLOT", "yes", "true or false"}},
		{"OUTBOXD_KAFKA_TOPIC_PARTITIONS=1.5", []string{"OUTBOXD_KAFKA_TOPIC_PARTITIONS", "1.5", "whole number"}},
		{"OUTBOXD_KAFKA_MAX_BUFFERED_RECORDS=10k", []string{"OUTBOXD_KAFKA_MAX_BUFFERED_RECORDS"}},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			_, err := config.Load("", []string{tt.env})
			if err == nil {
				t.Fatalf("Load with %s succeeded", tt.env)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	t.Run("every bad variable is reported", func(t *testing.T) {
		_, err := config.Load("", []string{"OUTBOXD_A=1", "OUTBOXD_KAFKA_LINGER=x", "OUTBOXD_B=2"})
		for _, w := range []string{"OUTBOXD_A", "OUTBOXD_KAFKA_LINGER", "OUTBOXD_B"} {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("error %v does not name %s", err, w)
			}
		}
	})
	t.Run("the environment is applied after the file", func(t *testing.T) {
		path := writeFile(t, "kafka:\n  linger: 1s\n")
		cfg, err := config.Load(path, []string{"OUTBOXD_KAFKA_LINGER=2s"})
		if err != nil || cfg.Kafka.Linger != 2*time.Second {
			t.Errorf("Load = %v, linger %s; want 2s from the environment", err, cfg.Kafka.Linger)
		}
	})
}

func TestValidateNamesField(t *testing.T) {
	tests := []struct {
		field string
		bad   func(*config.Config)
	}{
		{"postgres.dsn", func(c *config.Config) { c.Postgres.DSN = "host=h port=notaport" }},
		{"postgres.dsn", func(c *config.Config) { c.Postgres.DSN = "postgres://h:99999999/db" }},
		{"postgres.dsn", func(c *config.Config) { c.Postgres.DSN = "postgres://h/db?sslmode=sometimes" }},
		{"postgres.slot", func(c *config.Config) { c.Postgres.Slot = "" }},
		{"postgres.slot", func(c *config.Config) { c.Postgres.Slot = "Outboxd" }},
		{"postgres.slot", func(c *config.Config) { c.Postgres.Slot = "out-boxd" }},
		{"postgres.slot", func(c *config.Config) { c.Postgres.Slot = strings.Repeat("s", 64) }},
		{"postgres.publication", func(c *config.Config) { c.Postgres.Publication = "" }},
		{"postgres.table", func(c *config.Config) { c.Postgres.Table = "outbox" }},
		{"postgres.table", func(c *config.Config) { c.Postgres.Table = ".outbox" }},
		{"postgres.table", func(c *config.Config) { c.Postgres.Table = "public." }},
		{"postgres.table", func(c *config.Config) { c.Postgres.Table = "db.public.outbox" }},
		{"postgres.table", func(c *config.Config) { c.Postgres.Table = "" }},
		{"postgres.status_interval", func(c *config.Config) { c.Postgres.StatusInterval = 0 }},
		{"postgres.status_interval", func(c *config.Config) { c.Postgres.StatusInterval = 9 * time.Millisecond }},
		{"postgres.status_interval", func(c *config.Config) { c.Postgres.StatusInterval = 31 * time.Second }},
		{"postgres.confirm_interval", func(c *config.Config) { c.Postgres.ConfirmInterval = 0 }},
		{"postgres.confirm_interval", func(c *config.Config) { c.Postgres.ConfirmInterval = 9 * time.Millisecond }},
		{"postgres.confirm_interval", func(c *config.Config) { c.Postgres.ConfirmInterval = 31 * time.Second }},
		{"postgres.slot_lag_interval", func(c *config.Config) { c.Postgres.SlotLagInterval = 99 * time.Millisecond }},
		{"postgres.shards", func(c *config.Config) { c.Postgres.Shards = 0 }},
		{"postgres.shards", func(c *config.Config) { c.Postgres.Shards = 65 }},
		{"postgres.slot", func(c *config.Config) { c.Postgres.Slot, c.Postgres.Shards = strings.Repeat("s", 60), 2 }},
		{"postgres.slot", func(c *config.Config) { c.Postgres.Slot, c.Postgres.Shards = "outboxd_0of2", 4 }},
		{"postgres.publication", func(c *config.Config) { c.Postgres.Publication, c.Postgres.Shards = strings.Repeat("p", 60), 64 }},
		{"kafka.brokers", func(c *config.Config) { c.Kafka.Brokers = nil }},
		{"kafka.brokers", func(c *config.Config) { c.Kafka.Brokers = []string{} }},
		{"kafka.brokers", func(c *config.Config) { c.Kafka.Brokers = []string{"localhost"} }},
		{"kafka.brokers", func(c *config.Config) { c.Kafka.Brokers = []string{"k1:9092", "k2:"} }},
		{"kafka.brokers", func(c *config.Config) { c.Kafka.Brokers = []string{""} }},
		{"kafka.topic_creation", func(c *config.Config) { c.Kafka.TopicCreation = "" }},
		{"postgres.standby_dsns[1]", func(c *config.Config) {
			c.Postgres.StandbyDSNs = []string{"postgres://standby-a/app", "postgres://standby-b:notaport/app"}
		}},
		{"kafka.topic_creation", func(c *config.Config) { c.Kafka.TopicCreation = "auto" }},
		{"kafka.topic_partitions", func(c *config.Config) { c.Kafka.TopicPartitions = 0 }},
		{"kafka.topic_replication_factor", func(c *config.Config) { c.Kafka.TopicReplicationFactor = 0 }},
		{"kafka.topic_replication_factor", func(c *config.Config) { c.Kafka.TopicReplicationFactor = -2 }},
		{"kafka.max_buffered_records", func(c *config.Config) { c.Kafka.MaxBufferedRecords = 0 }},
		{"kafka.max_buffered_records", func(c *config.Config) { c.Kafka.MaxBufferedRecords = -5 }},
		{"kafka.max_buffered_bytes", func(c *config.Config) { c.Kafka.MaxBufferedBytes = 0 }},
		{"kafka.delivery_timeout", func(c *config.Config) { c.Kafka.DeliveryTimeout = 999 * time.Millisecond }},
		{"kafka.linger", func(c *config.Config) { c.Kafka.Linger = -time.Nanosecond }},
		{"kafka.linger", func(c *config.Config) { c.Kafka.Linger = time.Minute + 1 }},
		{"kafka.compression", func(c *config.Config) { c.Kafka.Compression = "" }},
		{"kafka.compression", func(c *config.Config) { c.Kafka.Compression = "brotli" }},
		{"kafka.delivery", func(c *config.Config) { c.Kafka.Delivery = "exactly-once" }},
		{"kafka.transaction_timeout", func(c *config.Config) { c.Kafka.TransactionTimeout = 16 * time.Minute }},
		{"kafka.transaction_interval", func(c *config.Config) { c.Kafka.TransactionInterval = 0 }},
		{"kafka.transaction_interval", func(c *config.Config) { c.Kafka.TransactionInterval = 20 * time.Second }},
		{"kafka.transaction_max_bytes", func(c *config.Config) { c.Kafka.TransactionMaxBytes = 10 }},
		{"kafka.positions_topic", func(c *config.Config) { c.Kafka.Delivery, c.Kafka.PositionsTopic = "exactly_once", "" }},
		{"kafka.positions_topic", func(c *config.Config) { c.Kafka.PositionsTopic = "outboxd positions" }},
		{"router.topic_template", func(c *config.Config) { c.Router.TopicTemplate = "" }},
		{"router.topic_template", func(c *config.Config) { c.Router.TopicTemplate = "outbox.$1" }},
		{"router.topic_template", func(c *config.Config) {
			c.Router.TopicRegex, c.Router.TopicTemplate = "(.*)", "${routedByValue}-events"
		}},
		{"router.topic_template", func(c *config.Config) { c.Router.TopicRegex, c.Router.TopicTemplate = "(.*)", "t.$2" }},
		{"router.topic_template", func(c *config.Config) { c.Router.TopicRegex, c.Router.TopicTemplate = "(.*)", "t.$1_v2" }},
		{"router.topic_template", func(c *config.Config) { c.Router.TopicRegex, c.Router.TopicTemplate = "(.*)", "t.${1" }},
		{"router.route_by_column", func(c *config.Config) { c.Router.RouteByColumn = "" }},
		{"router.id_column", func(c *config.Config) { c.Router.IDColumn = "" }},
		{"router.key_column", func(c *config.Config) { c.Router.KeyColumn = "" }},
		{"router.payload_column", func(c *config.Config) { c.Router.PayloadColumn = "" }},
		{"router.id_header", func(c *config.Config) { c.Router.IDHeader = "" }},
		{"router.event_type_header", func(c *config.Config) { c.Router.EventTypeHeader = "" }},
		{"http.listen", func(c *config.Config) { c.HTTP.Listen = "8080" }},
		{"http.listen", func(c *config.Config) { c.HTTP.Listen = "localhost" }},
		{"log.level", func(c *config.Config) { c.Log.Level = "" }},
		{"log.level", func(c *config.Config) { c.Log.Level = "trace" }},
		{"log.level", func(c *config.Config) { c.Log.Level = "INFO" }},
		{"log.format", func(c *config.Config) { c.Log.Format = "xml" }},
		{"shutdown_timeout", func(c *config.Config) { c.ShutdownTimeout = -time.Second }},
		{"postgres.backfill.batch", func(c *config.Config) { c.Postgres.Backfill.Batch = 0 }},
		{"postgres.backfill.rate", func(c *config.Config) { c.Postgres.Backfill.Rate = -1 }},
		{"postgres.backfill.order_by", func(c *config.Config) { c.Postgres.Backfill.OrderBy = "created_at" }},
		{"postgres.backfill", func(c *config.Config) { c.Postgres.Backfill.Where, c.Postgres.CreateSlot = "true", false }},
		{"postgres.backfill", func(c *config.Config) { c.Postgres.Backfill.Where, c.Postgres.Shards = "true", 2 }},
		{"postgres.backfill", func(c *config.Config) {
			c.Postgres.Backfill.Where, c.Postgres.Table, c.Router.Messages.Unowned = "true", "", config.UnownedIgnore
			c.Postgres.Tables = []config.TableEntry{{Name: "public.a"}, {Name: "public.b"}}
		}},
	}
	for _, tt := range tests {
		cfg := config.Default()
		tt.bad(&cfg)
		err := cfg.Validate()
		if err == nil {
			t.Errorf("%s: Validate accepted %+v", tt.field, cfg)
			continue
		}
		for _, line := range strings.Split(err.Error(), "\n") {
			if !strings.HasPrefix(line, tt.field+": ") {
				t.Errorf("%s: error line %q does not start with the field name", tt.field, line)
			}
		}
	}
}

func TestValidateAcceptsEdges(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*config.Config)
	}{
		{"shortest status interval", func(c *config.Config) { c.Postgres.StatusInterval = 10 * time.Millisecond }},
		{"longest status interval", func(c *config.Config) { c.Postgres.StatusInterval = 30 * time.Second }},
		{"shortest confirm interval", func(c *config.Config) { c.Postgres.ConfirmInterval = 10 * time.Millisecond }},
		{"confirm interval past the status interval", func(c *config.Config) { c.Postgres.ConfirmInterval = 30 * time.Second }},
		{"shortest slot lag interval", func(c *config.Config) { c.Postgres.SlotLagInterval = 100 * time.Millisecond }},
		{"63-character slot", func(c *config.Config) { c.Postgres.Slot = strings.Repeat("s", 63) }},
		{"slot with digits and underscores", func(c *config.Config) { c.Postgres.Slot = "outbox_2" }},
		{"key=value DSN", func(c *config.Config) { c.Postgres.DSN = "host=db port=5432 user=app password=secret dbname=shop" }},
		{"postgresql URL", func(c *config.Config) { c.Postgres.DSN = "postgresql://app:secret@db:5432/shop?sslmode=disable" }},
		{"broker topic creation", func(c *config.Config) { c.Kafka.TopicCreation = "broker" }},
		{"replication factor 1", func(c *config.Config) { c.Kafka.TopicReplicationFactor = 1 }},
		{"IPv6 broker", func(c *config.Config) { c.Kafka.Brokers = []string{"[::1]:9092"} }},
		{"linger 1m", func(c *config.Config) { c.Kafka.Linger = time.Minute }},
		{"delivery timeout 1s", func(c *config.Config) { c.Kafka.DeliveryTimeout = time.Second }},
		{"every compression", func(c *config.Config) { c.Kafka.Compression = "lz4" }},
		{"no event type", func(c *config.Config) { c.Router.EventTypeColumn, c.Router.EventTypeHeader = "", "" }},
		{"template without placeholder", func(c *config.Config) { c.Router.TopicTemplate = "events" }},
		{"regex groups by number and name", func(c *config.Config) {
			c.Router.TopicRegex, c.Router.TopicTemplate = `(?<routedByValue>[a-z]+)_(v\d)`, "${routedByValue}.$2.${2}_x.$$"
		}},
		{"http disabled", func(c *config.Config) { c.HTTP.Listen = "" }},
		{"zero shutdown timeout", func(c *config.Config) { c.ShutdownTimeout = 0 }},
		{"table without public schema", func(c *config.Config) { c.Postgres.Table = "app.outbox" }},
		{"backfill in exactly_once", func(c *config.Config) { c.Postgres.Backfill.Where, c.Kafka.Delivery = "true", "exactly_once" }},
	}
	for _, tt := range tests {
		cfg := config.Default()
		tt.mod(&cfg)
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: Validate() = %v", tt.name, err)
		}
	}
}

func TestValidateReportsEveryField(t *testing.T) {
	cfg := config.Default()
	cfg.Postgres.Slot = ""
	cfg.Kafka.Compression = "brotli"
	cfg.Log.Level = "loud"
	err := cfg.Validate()
	if err == nil {
		t.Fatal("Validate accepted three bad fields")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 3 {
		t.Fatalf("Validate() = %q, want 3 lines", err)
	}
	for i, f := range []string{"kafka.compression", "log.level", "postgres.slot"} { // sorted
		if !strings.HasPrefix(lines[i], f+": ") {
			t.Errorf("line %d = %q, want it to be about %s", i, lines[i], f)
		}
	}
}

func TestTableName(t *testing.T) {
	for table, want := range map[string][2]string{
		"public.outbox": {"public", "outbox"},
		"app.events":    {"app", "events"},
		"outbox":        {"public", "outbox"},
	} {
		s, n := config.Postgres{Table: table}.TableName()
		if s != want[0] || n != want[1] {
			t.Errorf("TableName(%q) = %q, %q; want %q, %q", table, s, n, want[0], want[1])
		}
	}
}

// TestFailoverSettings: postgres.failover_slot and postgres.standby_dsns
// from YAML and from the environment (a comma-separated list), and the
// standbys' passwords hidden in the redacted configuration.
func TestFailoverSettings(t *testing.T) {
	path := writeFile(t, "postgres:\n  failover_slot: true\n  standby_dsns:\n    - postgres://outboxd:pw-a@standby-a:5432/app\n    - host=standby-b password=pw-b\n")
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Postgres.FailoverSlot || len(cfg.Postgres.StandbyDSNs) != 2 {
		t.Fatalf("failover_slot %v, standby_dsns %q", cfg.Postgres.FailoverSlot, cfg.Postgres.StandbyDSNs)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	red := cfg.Redacted().Postgres.StandbyDSNs
	if strings.Contains(strings.Join(red, " "), "pw-") || cfg.Postgres.StandbyDSNs[0] != "postgres://outboxd:pw-a@standby-a:5432/app" {
		t.Errorf("redacted %q (the original must keep its password: %q)", red, cfg.Postgres.StandbyDSNs)
	}
	cfg, err = config.Load("", []string{"OUTBOXD_POSTGRES_FAILOVER_SLOT=true", "OUTBOXD_POSTGRES_STANDBY_DSNS=postgres://s1/app, postgres://s2/app"})
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Postgres.FailoverSlot || strings.Join(cfg.Postgres.StandbyDSNs, "|") != "postgres://s1/app|postgres://s2/app" {
		t.Errorf("from the environment: failover_slot %v, standby_dsns %q", cfg.Postgres.FailoverSlot, cfg.Postgres.StandbyDSNs)
	}
	if _, err := config.Load("", []string{"OUTBOXD_POSTGRES_FAILOVER_SLOT=maybe"}); err == nil || !strings.Contains(err.Error(), "OUTBOXD_POSTGRES_FAILOVER_SLOT") {
		t.Errorf("a bad boolean: %v", err)
	}
}

// TestValidateEnumValues: a setting with a fixed set of values is refused
// with its field and every allowed value named.
func TestValidateEnumValues(t *testing.T) {
	tests := []struct {
		mod  func(*config.Config)
		want string
	}{
		{func(c *config.Config) { c.Router.OnUpdate = "sometimes" }, `router.on_update: "sometimes" must be ignore, warn or error`},
		{func(c *config.Config) { c.Router.Poison.Policy = "skip" }, `router.poison.policy: "skip" must be halt or dlq`},
		{func(c *config.Config) { c.Router.KeyEncoding = "avro" }, `router.key_encoding: "avro" must be raw, json, json_schema or string`},
		{func(c *config.Config) { c.Router.AdditionalMissing = "warn" }, `router.additional_missing: "warn" must be error or ignore`},
		{func(c *config.Config) { c.Kafka.TopicCreation = "auto" }, `kafka.topic_creation: "auto" must be admin or broker (admin: outboxd creates missing topics; broker: the brokers' auto.create.topics.enable does)`},
		{func(c *config.Config) { c.Kafka.Compression = "brotli" }, `kafka.compression: "brotli" must be none, gzip, snappy, lz4 or zstd`},
		{func(c *config.Config) { c.Kafka.Delivery = "exactly-once" }, `kafka.delivery: "exactly-once" must be at_least_once or exactly_once`},
		{func(c *config.Config) { c.Log.Level = "trace" }, `log.level: "trace" must be debug, info, warn or error`},
		{func(c *config.Config) { c.Log.Format = "xml" }, `log.format: "xml" must be text or json`},
		{func(c *config.Config) { c.Router.AdditionalFields = []config.Field{{Column: "a", Placement: "body"}} },
			`router.additional_fields[0].placement: "body" must be header, envelope or partition`},
	}
	for _, tt := range tests {
		cfg := config.Default()
		tt.mod(&cfg)
		if err := cfg.Validate(); err == nil || err.Error() != tt.want {
			t.Errorf("Validate() = %v, want %s", err, tt.want)
		}
	}
}

// TestTopicTemplateGroupHints: a reference to a group the regular expression
// lacks is refused with the fix for that reference.
func TestTopicTemplateGroupHints(t *testing.T) {
	for tmpl, want := range map[string]string{
		"${routedByValue}-events": `router.topic_template: "${routedByValue}-events" refers to group "routedByValue", which router.topic_regex "(.*)" does not name; name a group (?<routedByValue>...) in it`,
		"t.$1_v2":                 `router.topic_template: "t.$1_v2" refers to group "1_v2", which router.topic_regex "(.*)" does not name; write ${1}_v2 for a group number followed by _v2`,
		"t.$region":               `router.topic_template: "t.$region" refers to group "region", which router.topic_regex "(.*)" does not name; name the group in it, or fix the reference`,
	} {
		cfg := config.Default()
		cfg.Router.TopicRegex, cfg.Router.TopicTemplate = "(.*)", tmpl
		if err := cfg.Validate(); err == nil || err.Error() != want {
			t.Errorf("Validate() = %v\nwant %s", err, want)
		}
	}
}
