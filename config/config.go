package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/shard"
)

// Config is the whole configuration of one outboxd.
type Config struct {
	Postgres Postgres `yaml:"postgres"`
	Kafka    Kafka    `yaml:"kafka"`
	Router   Router   `yaml:"router"`
	HTTP     HTTP     `yaml:"http"`
	Log      Log      `yaml:"log"`
	// ShutdownTimeout bounds the wait for in-flight records on SIGTERM.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
}

// Postgres says where the outbox lives and how to read it.
type Postgres struct {
	// DSN is a libpq connection string or URL. outboxd adds
	// replication=database itself for the replication connection. TLS is
	// set here as with libpq: sslmode (disable, allow, prefer, require,
	// verify-ca, verify-full), sslrootcert, sslcert, sslkey, sslpassword;
	// the PG* environment variables (PGPASSWORD, PGSSLMODE, ...) and
	// ~/.pgpass apply as with libpq.
	DSN string `yaml:"dsn"`
	// PasswordFile names a file holding the password (a mounted secret). It
	// is read at every connection, so a rotated secret is picked up; one
	// trailing newline is ignored. It overrides the DSN's password.
	PasswordFile string `yaml:"password_file"`
	Slot         string `yaml:"slot"`
	Publication  string `yaml:"publication"`
	// Table is the outbox table, schema-qualified: the one-table
	// shorthand of Tables. Setting both is an error.
	Table string `yaml:"table,omitempty"`
	// Tables lists the outbox tables, by name or pattern, each with the
	// router settings that differ for it (TableEntry). Load leaves Table
	// empty when Tables is set, except for one exact name (settleTables).
	Tables            []TableEntry  `yaml:"tables"`
	CreateSlot        bool          `yaml:"create_slot"`
	CreatePublication bool          `yaml:"create_publication"`
	StatusInterval    time.Duration `yaml:"status_interval"` // the keepalive period
	// ConfirmInterval is the shortest time between two status updates that
	// confirm a new position between keepalives: a position Kafka's
	// acknowledgements advance reaches Postgres at most this late, which
	// bounds what a crash repeats beyond the records in flight.
	ConfirmInterval time.Duration `yaml:"confirm_interval"`
	// ReceiveTimeout restarts the stream when nothing has come from Postgres
	// (no data, no keepalive) for this long; 0 takes the server's
	// wal_sender_timeout, read at each connection (60s if that is 0).
	ReceiveTimeout time.Duration `yaml:"receive_timeout"`
	// SlotLagInterval is how often slot lag is read from pg_replication_slots.
	SlotLagInterval time.Duration `yaml:"slot_lag_interval"`
	// StandbyPollInterval is how often a standby (another process holds the
	// slot) tries to take the slot over.
	StandbyPollInterval time.Duration `yaml:"standby_poll_interval"`
	// FailoverSlot creates the slot as a failover slot (Postgres 17 and
	// later), which standbys with sync_replication_slots = on keep a copy
	// of, so that outboxd resumes on a promoted standby. An existing slot
	// without failover is altered to have it.
	FailoverSlot bool `yaml:"failover_slot"`
	// StandbyDSNs are connection strings of physical standbys, one host
	// each, that the start-up check and outboxd status ask whether they
	// hold a synchronised copy of the slot. Optional; never logged.
	StandbyDSNs []string `yaml:"standby_dsns"`
	// Shards is the number of replication slots the outbox is split over
	// (docs/sharding.md): 1 is one slot and publication with the configured
	// names; N > 1 is N slots and publications named by shard.Name, each
	// with a row filter on the key column's hash, streamed by N pipelines.
	// Changing it and restarting reshards. Postgres 15 and later for N > 1.
	Shards int `yaml:"shards"`
	// Backfill delivers the rows already in the table when outboxd creates
	// its slot (docs/backfill.md); off while Where is empty.
	Backfill Backfill `yaml:"backfill"`
}

// Backfill is postgres.backfill: which rows already in the outbox table
// outboxd delivers before the slot's first event, in which order, how fast.
type Backfill struct {
	// Where is the body of a SQL WHERE over the outbox table's columns,
	// e.g. status IN ('PENDING','PROCESSING'); "" is no backfill.
	Where string `yaml:"where"`
	// OrderBy is the column whose order the rows are sent in, the primary
	// key breaking ties; "" is the primary key.
	OrderBy string `yaml:"order_by"`
	// Batch is the number of rows in a page. at_least_once hands pages to
	// Kafka up to kafka.max_buffered_records rows in flight (at least a
	// page), and a kill sends again at most those.
	Batch int `yaml:"batch"`
	// Rate caps the rows sent per second; 0 is no cap.
	Rate int `yaml:"rate"`
}

// On reports whether a backfill is configured.
func (b Backfill) On() bool { return strings.TrimSpace(b.Where) != "" }

// Kafka says where events go.
type Kafka struct {
	Brokers  []string `yaml:"brokers"`
	ClientID string   `yaml:"client_id"`
	// TopicCreation is "admin" (outboxd creates missing topics with
	// TopicPartitions and TopicReplicationFactor) or "broker" (left to the
	// broker's auto.create.topics.enable).
	TopicCreation          TopicCreation `yaml:"topic_creation"`
	TopicPartitions        int           `yaml:"topic_partitions"`
	TopicReplicationFactor int           `yaml:"topic_replication_factor"` // -1: the broker's default
	// MaxBufferedRecords caps records handed to Kafka and not yet acked;
	// at the cap outboxd stops reading WAL.
	MaxBufferedRecords int `yaml:"max_buffered_records"`
	// MaxBufferedBytes caps the bytes (keys, values and headers) of those
	// records; at the cap outboxd stops reading WAL too, so that memory stays
	// bounded with large events. A record larger than the cap is handed over
	// alone.
	MaxBufferedBytes int `yaml:"max_buffered_bytes"`
	// DeliveryTimeout: when records have been in flight this long without
	// any acknowledgement, the pipeline restarts from the slot.
	DeliveryTimeout time.Duration `yaml:"delivery_timeout"`
	// Linger is how long a partition's first record waits for more before
	// a produce request goes out; 0 sends at once. The default of 1 ms
	// batches the records of concurrent transactions into fewer produce
	// requests, which costs the broker less work per record than one
	// request per transaction, for at most 1 ms more latency.
	Linger time.Duration `yaml:"linger"`
	// MaxMessageBytes is the largest record outboxd sends (key, value and
	// headers); a larger row is a poison row. Keep it at or below the
	// topics' max.message.bytes.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// Compression is none, gzip, snappy, lz4 or zstd.
	Compression Compression `yaml:"compression"`
	TLS         TLS         `yaml:"tls"`
	SASL        SASL        `yaml:"sasl"`
	// Delivery is at_least_once (records acknowledged one by one; a crash
	// repeats the unconfirmed window) or exactly_once (Kafka transactions
	// aligned to Postgres transactions, with outboxd's position written
	// in the same transaction; docs/exactly-once.md).
	Delivery Delivery `yaml:"delivery"`
	// TransactionalID is the transactional id of exactly_once; "" derives
	// it from the database's system identifier and the slot name.
	TransactionalID string `yaml:"transactional_id"`
	// TransactionInterval: a Kafka transaction is committed at the first
	// Postgres transaction boundary after it has been open this long (or
	// holds max_buffered_records records).
	TransactionInterval time.Duration `yaml:"transaction_interval"`
	// TransactionTimeout is the Kafka transaction timeout; a Postgres
	// transaction that keeps a Kafka transaction open for half of it (or of
	// DeliveryTimeout, if shorter) is split over several.
	TransactionTimeout time.Duration `yaml:"transaction_timeout"`
	// TransactionMaxBytes splits a Postgres transaction whose records in
	// one Kafka transaction reach it.
	TransactionMaxBytes int `yaml:"transaction_max_bytes"`
	// PositionsTopic is the compacted topic exactly_once writes its
	// position to, in the same transaction as the records.
	PositionsTopic string `yaml:"positions_topic"`
}

// ExactlyOnce reports whether kafka.delivery is exactly_once.
func (k Kafka) ExactlyOnce() bool { return k.Delivery == ExactlyOnce }

// Router maps outbox rows (and logical messages) to Kafka records, with the
// options of Debezium's Outbox EventRouter. Column settings left empty take
// the Preset's names.
type Router struct {
	// Preset names the column set: outboxd (id, aggregate_type,
	// aggregate_id, event_type, payload) or debezium (id, aggregatetype,
	// aggregateid, type, payload).
	Preset string `yaml:"preset"`
	// TopicTemplate names the topic; ${routedByValue} stands for the
	// route-by column's value, as in Debezium's route.topic.replacement.
	TopicTemplate string `yaml:"topic_template"`
	// TopicRegex, if set, must match the whole route-by value (else the row
	// is a poison row); TopicTemplate then names the topic with its groups
	// ($1, ${1}, ${name}; ${routedByValue} is the group of that name), as
	// Debezium's route.topic.regex and route.topic.replacement do.
	TopicRegex string `yaml:"topic_regex"`
	// TopicColumn, if set, names a column whose non-NULL value is the topic,
	// overriding the template for that row.
	TopicColumn       string `yaml:"topic_column"`
	RouteByColumn     string `yaml:"route_by_column"`
	IDColumn          string `yaml:"id_column"`
	KeyColumn         string `yaml:"key_column"`
	PayloadColumn     string `yaml:"payload_column"`
	EventTypeColumn   string `yaml:"event_type_column"` // "-" sends no type header
	TimestampColumn   string `yaml:"timestamp_column"`  // record timestamp; else the commit time
	TraceparentColumn string `yaml:"traceparent_column"`
	// HeadersColumn, if set, names a json or jsonb column (or message field)
	// holding an object; each member becomes a record header, string values
	// as their text, other values as their JSON, null as a null header.
	HeadersColumn   string `yaml:"headers_column"`
	IDHeader        string `yaml:"id_header"`
	EventTypeHeader string `yaml:"event_type_header"`
	// AdditionalFields places more columns, like Debezium's
	// table.fields.additional.placement.
	AdditionalFields []Field `yaml:"additional_fields"`
	// AdditionalMissing is error or ignore: what a placed column absent
	// from the table does.
	AdditionalMissing AdditionalMissing `yaml:"additional_missing"`
	// KeyEncoding is raw (the key column's bytes), json (the key as Kafka
	// Connect's JsonConverter with schemas off wrote it: a JSON string,
	// quotes included, integers bare) or json_schema (as JsonConverter with
	// schemas on, its default, wrote it: {"schema":...,"payload":...}) or
	// string (as StringConverter wrote it: Java's toString of the value
	// Debezium made of the column, such as a numeric's BigDecimal).
	KeyEncoding KeyEncoding `yaml:"key_encoding"`
	// ExpandJSONPayload writes the payload as Debezium's
	// table.expand.json.payload under JsonConverter (schemas off) wrote it:
	// parsed, rebuilt with an inferred schema and written compactly (null
	// fields and empty arrays dropped, numbers as Java int, long or double);
	// a payload Debezium declines to expand as a JSON string, NULL as null.
	ExpandJSONPayload bool `yaml:"expand_json_payload"`
	// TombstoneOnEmptyPayload sends a NULL or blank payload (nothing but
	// characters up to U+0020; never a bytea one) as a tombstone: key kept,
	// value null, no envelope. Without it, as with Debezium, a NULL payload
	// is a null value, or null in the envelope.
	TombstoneOnEmptyPayload bool `yaml:"tombstone_on_empty_payload"`
	// RequireKey makes a NULL key a poison row; without it the record has a
	// null key (and no per-key order).
	RequireKey bool `yaml:"require_key"`
	// OnUpdate is ignore, warn or error (error stops outboxd).
	OnUpdate OnUpdate `yaml:"on_update"`
	Messages Messages `yaml:"messages"`
	Poison   Poison   `yaml:"poison"`
	// DebeziumHeaders writes the context headers Debezium 3.2.1 and later
	// adds to every record, for readers that depend on them.
	DebeziumHeaders DebeziumHeaders `yaml:"debezium_headers"`
}

// DebeziumHeaders are the four __debezium.context.* headers Debezium 3.2.1
// and later writes before the id header unless extended.headers.enabled is
// false. With Enabled, outboxd writes them with these values.
type DebeziumHeaders struct {
	Enabled bool `yaml:"enabled"`
	// ConnectorLogicalName is __debezium.context.connectorLogicalName,
	// Debezium's topic.prefix; required when Enabled.
	ConnectorLogicalName string `yaml:"connector_logical_name"`
	// TaskID is __debezium.context.taskId, "0" for a one-task connector.
	TaskID string `yaml:"task_id"`
	// ConnectorName is __debezium.context.connectorName: "postgresql".
	ConnectorName string `yaml:"connector_name"`
	// RunID is __debezium.context.runId; "" is a random UUID chosen at
	// each start, as Debezium's task chooses one.
	RunID string `yaml:"run_id"`
}

// Field places one additional column.
type Field struct {
	Column    string    `yaml:"column"`
	Placement Placement `yaml:"placement"` // header, envelope or partition
	Alias     string    `yaml:"alias"`     // header or envelope field name; default the column name
}

// Messages routes events written with pg_logical_emit_message(true, prefix,
// content) instead of a table. content is a JSON object whose fields are
// named like the columns (id, aggregate_type, aggregate_id, event_type,
// payload, ...).
type Messages struct {
	// Prefix is the prefix of the messages routed; "" disables message
	// events. The default, "outbox", is the prefix package outbox writes.
	Prefix string `yaml:"prefix"`
	// DefaultRouteBy routes a message without a route-by field.
	DefaultRouteBy string `yaml:"default_route_by"`
	// Unowned says what a message that names no outbox table (the field
	// "__outbox_table" absent, null or "") does: deliver (the default) or
	// ignore. A message that names one (package outbox writes an explicit
	// Config.Table there) is delivered only by the outboxd whose
	// postgres.table it names, whatever this says; with several deployments
	// on one database, exactly one should deliver the messages that name
	// none.
	Unowned Unowned `yaml:"unowned"`
}

// Poison says what happens to a row that cannot be routed.
type Poison struct {
	Policy   PoisonPolicy `yaml:"policy"`    // halt or dlq
	DLQTopic string       `yaml:"dlq_topic"` // for dlq
}

// ParseFields parses Debezium's placement syntax, a comma-separated list of
// column:placement[:alias], e.g. "type:header:eventType,region:partition".
func ParseFields(s string) ([]Field, error) {
	var out []Field
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		parts := strings.Split(item, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return nil, fmt.Errorf("%q is not column:placement[:alias]", item)
		}
		f := Field{Column: parts[0], Placement: Placement(parts[1])}
		if len(parts) == 3 {
			f.Alias = parts[2]
		}
		out = append(out, f)
	}
	return out, nil
}

// Presets of column names.
var presets = map[string]Router{
	"outboxd":  {RouteByColumn: "aggregate_type", IDColumn: "id", KeyColumn: "aggregate_id", PayloadColumn: "payload", EventTypeColumn: "event_type"},
	"debezium": {RouteByColumn: "aggregatetype", IDColumn: "id", KeyColumn: "aggregateid", PayloadColumn: "payload", EventTypeColumn: "type"},
}

// resolve fills the column names left empty from the preset.
func (r *Router) resolve() {
	p, ok := presets[r.Preset]
	if !ok {
		return
	}
	fill := func(dst *string, v string) {
		if *dst == "" {
			*dst = v
		}
	}
	fill(&r.RouteByColumn, p.RouteByColumn)
	fill(&r.IDColumn, p.IDColumn)
	fill(&r.KeyColumn, p.KeyColumn)
	fill(&r.PayloadColumn, p.PayloadColumn)
	fill(&r.EventTypeColumn, p.EventTypeColumn)
}

// HTTP serves /metrics and /healthz.
type HTTP struct {
	Listen string `yaml:"listen"` // "" disables the server
	// PProf serves Go's profiler under /debug/pprof/ (off by default: it
	// exposes internals, so keep http.listen private when it is on).
	PProf bool `yaml:"pprof"`
}

// Log configures log/slog output on stderr.
type Log struct {
	Level  LogLevel  `yaml:"level"`  // debug, info, warn, error
	Format LogFormat `yaml:"format"` // text or json
}

// Default returns the configuration used for every field a file and the
// environment leave unset, with the outboxd column preset.
func Default() Config { return defaultFor("outboxd") }

func defaultFor(preset string) Config {
	c := base()
	c.Router.Preset = preset
	c.Router.resolve()
	return c
}

func base() Config {
	return Config{
		Postgres: Postgres{
			DSN:                 "postgres://postgres@127.0.0.1:5432/postgres",
			Slot:                "outboxd",
			Publication:         "outboxd",
			Table:               "public.outbox",
			CreateSlot:          true,
			CreatePublication:   true,
			StatusInterval:      time.Second,
			ConfirmInterval:     50 * time.Millisecond,
			SlotLagInterval:     10 * time.Second,
			StandbyPollInterval: time.Second,
			Shards:              1,
			Backfill:            Backfill{Batch: 500},
		},
		Kafka: Kafka{
			Brokers:                []string{"127.0.0.1:9092"},
			ClientID:               "outboxd",
			TopicCreation:          TopicCreationAdmin,
			TopicPartitions:        6,
			TopicReplicationFactor: -1,
			MaxBufferedRecords:     10000,
			MaxBufferedBytes:       32 << 20,
			DeliveryTimeout:        2 * time.Minute,
			Linger:                 time.Millisecond,
			MaxMessageBytes:        1000000,
			Compression:            CompressionNone,
			Delivery:               AtLeastOnce,
			TransactionInterval:    100 * time.Millisecond,
			TransactionTimeout:     time.Minute,
			TransactionMaxBytes:    64 << 20,
			PositionsTopic:         "outboxd-positions",
		},
		Router: Router{
			Preset:            "outboxd",
			TopicTemplate:     "${routedByValue}-events",
			IDHeader:          "id",
			EventTypeHeader:   "eventType",
			AdditionalMissing: AdditionalMissingError,
			KeyEncoding:       KeyEncodingRaw,
			RequireKey:        true,
			OnUpdate:          OnUpdateWarn,
			Messages:          Messages{Prefix: "outbox", Unowned: UnownedDeliver},
			DebeziumHeaders:   DebeziumHeaders{TaskID: "0", ConnectorName: "postgresql"},
			Poison:            Poison{Policy: PoisonHalt},
		},
		HTTP:            HTTP{Listen: ":8080"},
		Log:             Log{Level: LogInfo, Format: LogText},
		ShutdownTimeout: 10 * time.Second,
	}
}

// peekPreset finds router.preset in the YAML data and the environment, so
// that Load can start from that preset's column names.
func peekPreset(data []byte, environ []string) string {
	var doc struct {
		Router struct {
			Preset string `yaml:"preset"`
		} `yaml:"router"`
	}
	_ = yaml.Unmarshal(data, &doc) // errors surface in the strict decode
	preset := doc.Router.Preset
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, EnvPrefix+"ROUTER_PRESET="); ok {
			preset = v
		}
	}
	if preset == "" {
		preset = "outboxd"
	}
	return preset
}

// Load returns the defaults overlaid with the YAML file at path (skipped when
// path is "") and then with the OUTBOXD_* variables in environ.
func Load(path string, environ []string) (Config, error) {
	var data []byte
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return Default(), fmt.Errorf("reading config file: %w", err)
		}
	}
	cfg := defaultFor(peekPreset(data, environ))
	if err := Decode(data, &cfg); err != nil {
		return cfg, fmt.Errorf("config file %s: %w", path, err)
	}
	if err := applyEnv(&cfg, environ); err != nil {
		return cfg, err
	}
	if err := settleTables(&cfg, data, environ); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// Decode overlays YAML data onto cfg. Unknown keys are errors. A duration
// written as a bare number is an error that says to add a unit; a list of
// strings may be written as one string (brokers: k1:9092), comma-separated
// as in the environment.
func Decode(data []byte, cfg *Config) error {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err == nil && len(root.Content) == 1 {
		changed, err := lenient(root.Content[0], reflect.TypeOf(*cfg), "")
		if err != nil {
			return err
		}
		if changed {
			if data, err = yaml.Marshal(&root); err != nil {
				return fmt.Errorf("re-encoding the configuration: %w", err)
			}
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s", explainUnknown(strings.ReplaceAll(err.Error(), "yaml: ", "")))
	}
	if err := dec.Decode(new(any)); !errors.Is(err, io.EOF) {
		return errors.New("more than one YAML document; put every setting in one document")
	}
	return settleTables(cfg, data, nil)
}

// lenient walks a YAML mapping beside the struct type it decodes into: it
// refuses a bare number for a duration, naming the setting and the unit to
// add, and turns a string where a list of strings goes into that list. It
// reports whether it changed the tree. Unknown keys are left to the strict
// decoder.
func lenient(n *yaml.Node, t reflect.Type, path string) (changed bool, err error) {
	if n.Kind != yaml.MappingNode || t.Kind() != reflect.Struct {
		return false, nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i].Value, n.Content[i+1]
		for j := range t.NumField() {
			f := t.Field(j)
			if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); tag != key {
				continue
			}
			name := path + key
			switch {
			case f.Type == reflect.TypeOf(time.Duration(0)) && val.Kind == yaml.ScalarNode && val.Tag == "!!int":
				return false, fmt.Errorf("line %d: %s: %s has no unit; write %ss (or 500ms, 10s, 2m: a Go duration)", val.Line, name, val.Value, val.Value)
			case f.Type == reflect.TypeOf([]string(nil)) && val.Kind == yaml.ScalarNode && val.Tag == "!!str":
				items := []*yaml.Node{}
				for _, part := range strings.Split(val.Value, ",") {
					if part = strings.TrimSpace(part); part != "" {
						items = append(items, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: part})
					}
				}
				*val = yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Style: yaml.FlowStyle, Content: items, Line: val.Line, Column: val.Column}
				changed = true
			case f.Type.Kind() == reflect.Struct:
				c, err := lenient(val, f.Type, name+".")
				if err != nil {
					return false, err
				}
				changed = changed || c
			}
		}
	}
	return changed, nil
}

// EnvPrefix starts every environment override.
const EnvPrefix = "OUTBOXD_"

// applyEnv sets fields from OUTBOXD_* variables.
func applyEnv(cfg *Config, environ []string) error {
	fields := map[string]reflect.Value{}
	collect(reflect.ValueOf(cfg).Elem(), EnvPrefix, fields)
	var errs []error
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) || strings.HasPrefix(name, EnvPrefix+"TEST") {
			continue
		}
		f, ok := fields[name]
		if !ok {
			hint := ""
			names := make([]string, 0, len(fields))
			for n := range fields {
				names = append(names, n)
			}
			if best := closest(name, names); best != "" {
				hint = " (did you mean " + best + "?)"
			}
			errs = append(errs, fmt.Errorf("environment variable %s names no setting%s; see the README for the OUTBOXD_* names", name, hint))
			continue
		}
		if err := setField(f, value); err != nil {
			errs = append(errs, fmt.Errorf("environment variable %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

func collect(v reflect.Value, prefix string, out map[string]reflect.Value) {
	t := v.Type()
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		name := prefix + strings.ToUpper(tag)
		f := v.Field(i)
		if f.Kind() == reflect.Struct {
			collect(f, name+"_", out)
			continue
		}
		out[name] = f
	}
}

func setField(f reflect.Value, s string) error {
	switch f.Interface().(type) {
	case time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
				return fmt.Errorf("%q has no unit; write %ss (or 500ms, 10s, 2m: a Go duration)", s, s)
			}
			return fmt.Errorf("%q is not a duration such as 500ms or 10s", s)
		}
		f.Set(reflect.ValueOf(d))
	case bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("%q is not true or false", s)
		}
		f.SetBool(b)
	case int:
		n, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("%q is not a whole number", s)
		}
		f.SetInt(int64(n))
	case []Field:
		fields, err := ParseFields(s)
		if err != nil {
			return err
		}
		f.Set(reflect.ValueOf(fields))
	case []TableEntry:
		var list []TableEntry
		for _, part := range strings.Split(s, ",") {
			if part = strings.TrimSpace(part); part != "" {
				list = append(list, TableEntry{Name: part})
			}
		}
		f.Set(reflect.ValueOf(list))
	case []string:
		var list []string
		for _, part := range strings.Split(s, ",") {
			if part = strings.TrimSpace(part); part != "" {
				list = append(list, part)
			}
		}
		f.Set(reflect.ValueOf(list))
	default:
		if f.Kind() != reflect.String { // string and the types of settings with a fixed set of values
			return fmt.Errorf("unsupported field type %s", f.Type())
		}
		f.SetString(s)
	}
	return nil
}

// MaxShards is the largest postgres.shards: each shard is a replication
// slot, a walsender and a pipeline, so far fewer fit the usual
// max_replication_slots, max_wal_senders and cores.
const MaxShards = 64

// TableName splits Postgres.Table into schema and table.
func (p Postgres) TableName() (schema, table string) {
	schema, table, ok := strings.Cut(p.Table, ".")
	if !ok {
		return "public", p.Table
	}
	return schema, table
}

// Validate checks every field and names each bad one.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if _, err := pgconn.ParseConfig(c.Postgres.DSN); err != nil {
		bad("postgres.dsn", "not a valid connection string%s; the value is not shown because it may hold a password", dsnReason(err))
	}
	if !validSlotName(c.Postgres.Slot) {
		bad("postgres.slot", "%q must be 1-63 characters of lower-case letters, digits and underscores", c.Postgres.Slot)
	}
	if c.Postgres.Publication == "" {
		bad("postgres.publication", "must not be empty")
	}
	switch {
	case len(c.Postgres.Tables) > 0 && c.Postgres.Table != "" && !c.Postgres.oneTable():
		bad("postgres.table", "%q is set beside postgres.tables; postgres.table is the shorthand for one table: list every table under postgres.tables", c.Postgres.Table)
	case len(c.Postgres.Tables) > 0:
		errs = append(errs, c.validateTables()...)
		errs = append(errs, c.validateSeveral()...)
	default:
		if schema, table, ok := strings.Cut(c.Postgres.Table, "."); !ok || schema == "" || table == "" || strings.Contains(table, ".") {
			bad("postgres.table", "%q must be schema-qualified, like public.outbox", c.Postgres.Table)
		}
	}
	if c.Postgres.StatusInterval < 10*time.Millisecond || c.Postgres.StatusInterval > 30*time.Second {
		bad("postgres.status_interval", "%s must be between 10ms and 30s (Postgres drops replication connections silent for wal_sender_timeout, 60s by default)", c.Postgres.StatusInterval)
	}
	if c.Postgres.ConfirmInterval < 10*time.Millisecond || c.Postgres.ConfirmInterval > 30*time.Second {
		bad("postgres.confirm_interval", "%s must be between 10ms and 30s (at or above status_interval, positions are confirmed with the keepalives only)", c.Postgres.ConfirmInterval)
	}
	if c.Postgres.StandbyPollInterval < 100*time.Millisecond {
		bad("postgres.standby_poll_interval", "%s must be at least 100ms", c.Postgres.StandbyPollInterval)
	}
	if c.Postgres.ReceiveTimeout != 0 && c.Postgres.ReceiveTimeout < 2*c.Postgres.StatusInterval {
		bad("postgres.receive_timeout", "%s must be 0 (the server's wal_sender_timeout) or at least twice postgres.status_interval (%s): "+
			"a live server may stay silent for a status interval", c.Postgres.ReceiveTimeout, c.Postgres.StatusInterval)
	}
	if c.Postgres.SlotLagInterval < 100*time.Millisecond {
		bad("postgres.slot_lag_interval", "%s must be at least 100ms", c.Postgres.SlotLagInterval)
	}
	if c.Postgres.Shards < 1 || c.Postgres.Shards > MaxShards {
		bad("postgres.shards", "%d must be between 1 and %d (each shard is a replication slot and a walsender)", c.Postgres.Shards, MaxShards)
	} else if c.Postgres.Shards > 1 {
		if _, err := shard.Names(c.Postgres.Slot, c.Postgres.Shards); err != nil {
			bad("postgres.slot", "%v", err)
		}
		if _, err := shard.Names(c.Postgres.Publication, c.Postgres.Shards); err != nil {
			bad("postgres.publication", "%v", err)
		}
	}
	errs = append(errs, c.validateBackfill()...)
	for i, dsn := range c.Postgres.StandbyDSNs {
		if _, err := pgconn.ParseConfig(dsn); err != nil {
			bad(fmt.Sprintf("postgres.standby_dsns[%d]", i), "not a valid connection string%s; the value is not shown because it may hold a password", dsnReason(err))
		}
	}
	if len(c.Kafka.Brokers) == 0 {
		bad("kafka.brokers", "must list at least one host:port")
	}
	for _, b := range c.Kafka.Brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || !validPort(port) {
			bad("kafka.brokers", "%q is not host:port", b)
		}
	}
	if c.Kafka.TopicPartitions < 1 {
		bad("kafka.topic_partitions", "%d must be at least 1", c.Kafka.TopicPartitions)
	}
	if c.Kafka.TopicReplicationFactor == 0 || c.Kafka.TopicReplicationFactor < -1 {
		bad("kafka.topic_replication_factor", "%d must be -1 (the broker's default) or at least 1", c.Kafka.TopicReplicationFactor)
	}
	if c.Kafka.MaxBufferedRecords < 1 {
		bad("kafka.max_buffered_records", "%d must be at least 1", c.Kafka.MaxBufferedRecords)
	}
	if c.Kafka.MaxBufferedBytes < 1 {
		bad("kafka.max_buffered_bytes", "%d must be at least 1", c.Kafka.MaxBufferedBytes)
	}
	if c.Kafka.DeliveryTimeout < time.Second {
		bad("kafka.delivery_timeout", "%s must be at least 1s", c.Kafka.DeliveryTimeout)
	}
	if c.Kafka.MaxMessageBytes < 1024 {
		bad("kafka.max_message_bytes", "%d must be at least 1024", c.Kafka.MaxMessageBytes)
	}
	if c.Kafka.Linger < 0 || c.Kafka.Linger > time.Minute {
		bad("kafka.linger", "%s must be between 0 and 1m", c.Kafka.Linger)
	}
	errs = append(errs, c.validateEnums()...)
	errs = append(errs, c.Kafka.validateDelivery()...)
	errs = append(errs, c.Postgres.validateSecrets()...)
	errs = append(errs, c.Kafka.TLS.validate()...)
	errs = append(errs, c.Kafka.SASL.validate()...)
	errs = append(errs, c.Router.validate()...)
	if c.HTTP.Listen != "" {
		if _, _, err := net.SplitHostPort(c.HTTP.Listen); err != nil {
			bad("http.listen", "%q is not host:port (or :port)", c.HTTP.Listen)
		}
	}
	if c.ShutdownTimeout < 0 {
		bad("shutdown_timeout", "%s must not be negative", c.ShutdownTimeout)
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

func (k Kafka) validateDelivery() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("kafka.%s: %s", field, fmt.Sprintf(format, args...)))
	}
	// Kafka's transaction.max.timeout.ms is 15 minutes by default.
	if k.TransactionTimeout < time.Second || k.TransactionTimeout > 15*time.Minute {
		bad("transaction_timeout", "%s must be between 1s and 15m (the brokers' transaction.max.timeout.ms, 15m by default, caps it)", k.TransactionTimeout)
	}
	if k.TransactionInterval < time.Millisecond || k.TransactionInterval > k.TransactionTimeout/4 {
		bad("transaction_interval", "%s must be at least 1ms and at most a quarter of kafka.transaction_timeout (%s)", k.TransactionInterval, k.TransactionTimeout)
	}
	if k.TransactionMaxBytes < 1024 {
		bad("transaction_max_bytes", "%d must be at least 1024", k.TransactionMaxBytes)
	}
	if k.PositionsTopic == "" || len(k.PositionsTopic) > 249 || strings.Trim(k.PositionsTopic, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
		bad("positions_topic", "%q must be a Kafka topic name: 1-249 letters, digits, '.', '_' or '-'", k.PositionsTopic)
	}
	if len(k.TransactionalID) > 200 {
		bad("transactional_id", "must be at most 200 characters")
	}
	return errs
}

func (r Router) validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("router.%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if _, ok := presets[r.Preset]; !ok {
		bad("preset", "%q must be outboxd or debezium", r.Preset)
	}
	if r.TopicTemplate == "" {
		bad("topic_template", "must not be empty")
	}
	if r.TopicRegex != "" {
		if re, err := regexp.Compile(r.TopicRegex); err != nil {
			bad("topic_regex", "not a valid regular expression: %v", err)
		} else if err := checkGroups(r.TopicTemplate, re); err != nil {
			bad("topic_template", "%v", err)
		}
	} else if t := strings.ReplaceAll(r.TopicTemplate, "${routedByValue}", ""); strings.Contains(t, "$") {
		bad("topic_template", "%q has a $ other than ${routedByValue}; a group reference needs router.topic_regex, and a topic name cannot hold a literal $", r.TopicTemplate)
	}
	for field, v := range map[string]string{
		"route_by_column": r.RouteByColumn, "id_column": r.IDColumn, "key_column": r.KeyColumn,
		"payload_column": r.PayloadColumn, "id_header": r.IDHeader,
	} {
		if v == "" {
			bad(field, "must not be empty")
		}
	}
	if r.EventTypeColumn != "" && r.EventTypeColumn != "-" && r.EventTypeHeader == "" {
		bad("event_type_header", "must not be empty while router.event_type_column is set")
	}
	errs = append(errs, r.repeatedHeaders()...)
	partitions := 0
	for i, f := range r.AdditionalFields {
		switch {
		case f.Column == "":
			bad(fmt.Sprintf("additional_fields[%d].column", i), "must not be empty")
		case f.Placement == PlacementPartition:
			partitions++
		}
	}
	if partitions > 1 {
		bad("additional_fields", "at most one column may be placed as partition")
	}
	if r.Poison.Policy == PoisonDLQ && r.Poison.DLQTopic == "" {
		bad("poison.dlq_topic", "must name a topic when router.poison.policy is dlq")
	}
	if h := r.DebeziumHeaders; h.Enabled && h.ConnectorLogicalName == "" {
		bad("debezium_headers.connector_logical_name", "must be set when router.debezium_headers.enabled is true: the connector's topic.prefix")
	}
	return errs
}

// repeatedHeaders refuses a header name that router.id_header or
// router.event_type_header shares with another header of the same record:
// the record would carry two, and a consumer, or outboxd dlq, would read the
// other one's value as the event id or type. (Members of
// router.headers_column are refused row by row, by the router.)
func (r Router) repeatedHeaders() []error {
	var errs []error
	type named struct{ setting, header string }
	own := []named{{"id_header", r.IDHeader}}
	if r.EventTypeColumn != "" && r.EventTypeColumn != "-" {
		own = append(own, named{"event_type_header", r.EventTypeHeader})
	}
	var others []named
	if len(own) == 2 {
		others = append(others, own[0])
	}
	if r.TraceparentColumn != "" {
		others = append(others, named{"traceparent_column", "traceparent"})
	}
	for i, f := range r.AdditionalFields {
		if f.Placement == PlacementHeader {
			h := f.Alias
			if h == "" {
				h = f.Column
			}
			others = append(others, named{fmt.Sprintf("additional_fields[%d] (column %s, placement header)", i, f.Column), h})
		}
	}
	for _, o := range own {
		for _, x := range others {
			if x.header == o.header && x.setting != o.setting {
				errs = append(errs, fmt.Errorf("router.%s: %q is also the header of router.%s: each record would carry two %q headers, "+
					"and consumers and outboxd dlq would read one's value as the other's; give one of them another name", o.setting, o.header, x.setting, o.header))
			}
		}
	}
	return errs
}

// checkGroups checks that every group the template refers to ($1, ${1},
// $name, ${name}; $$ is a dollar sign) is a group of re, as Java's
// Matcher, which Debezium uses, refuses a reference to a missing group.
func checkGroups(tmpl string, re *regexp.Regexp) error {
	for i := 0; i < len(tmpl); i++ {
		if tmpl[i] != '$' {
			continue
		}
		rest := tmpl[i+1:]
		var name string
		switch {
		case strings.HasPrefix(rest, "$"):
			i++
			continue
		case strings.HasPrefix(rest, "{"):
			end := strings.IndexByte(rest, '}')
			if end < 0 {
				return fmt.Errorf("%q has a ${ without its }", tmpl)
			}
			name = rest[1:end]
		default:
			n := 0
			for n < len(rest) && (rest[n] == '_' || rest[n] >= '0' && rest[n] <= '9' || rest[n] >= 'a' && rest[n] <= 'z' || rest[n] >= 'A' && rest[n] <= 'Z') {
				n++
			}
			name = rest[:n]
		}
		if num, err := strconv.Atoi(name); err == nil && num >= 0 {
			if num > re.NumSubexp() {
				return fmt.Errorf("%q refers to group %d, but router.topic_regex %q has %d groups", tmpl, num, re, re.NumSubexp())
			}
			continue
		}
		if name == "" || re.SubexpIndex(name) < 0 {
			return fmt.Errorf("%q refers to group %q, which router.topic_regex %q does not name; %s", tmpl, name, re, groupHint(name))
		}
	}
	return nil
}

// groupHint says how to fix a template's reference to a group name the
// regular expression lacks.
func groupHint(name string) string {
	digits := strings.TrimLeft(name, "0123456789")
	switch {
	case name == "routedByValue":
		return "name a group (?<routedByValue>...) in it"
	case digits != name && name != "":
		// $1_x is group "1_x": a reference runs on over letters, digits and _.
		return fmt.Sprintf("write ${%s}%s for a group number followed by %s", name[:len(name)-len(digits)], digits, digits)
	}
	return "name the group in it, or fix the reference"
}

func validPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n > 0 && n < 65536
}

func validSlotName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// dsnReason returns what pgconn found wrong with a connection string,
// without the string: pgconn's message is "cannot parse `<string, password
// masked>`: <what is wrong>", and only the second part is kept (a URL parse
// error's own copy of the URL included).
func dsnReason(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return ""
	}
	msg := pe.Error()
	i := strings.Index(msg, "`: ")
	if i < 0 {
		return ""
	}
	msg = msg[i+3:]
	var ue *url.Error
	if errors.As(err, &ue) {
		msg = strings.ReplaceAll(msg, ue.Error(), ue.Err.Error())
	}
	return " (" + msg + ")"
}

// Redacted returns a copy of c with every secret replaced (the DSN's
// passwords, the SASL password), for --check-config output and logs. Secret
// files are named, never read.
func (c Config) Redacted() Config {
	c.Postgres.DSN = RedactDSN(c.Postgres.DSN)
	if len(c.Postgres.Tables) > 0 {
		c.Postgres.Table = "" // Load set the shorthand from postgres.tables: print what loads back
	}
	if c.Postgres.StandbyDSNs != nil {
		dsns := make([]string, len(c.Postgres.StandbyDSNs))
		for i, dsn := range c.Postgres.StandbyDSNs {
			dsns[i] = RedactDSN(dsn)
		}
		c.Postgres.StandbyDSNs = dsns
	}
	if c.Kafka.SASL.Password != "" {
		c.Kafka.SASL.Password = mask
	}
	return c
}

// validateBackfill checks postgres.backfill, and refuses it where this
// outboxd cannot backfill yet.
func (c Config) validateBackfill() []error {
	b := c.Postgres.Backfill
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if b.Batch < 1 || b.Batch > 100000 {
		bad("postgres.backfill.batch", "%d must be between 1 and 100000 rows", b.Batch)
	}
	if b.Rate < 0 {
		bad("postgres.backfill.rate", "%d must be 0 (no limit) or a number of rows per second", b.Rate)
	}
	if !b.On() {
		if b.OrderBy != "" {
			bad("postgres.backfill.order_by", "%q is set without postgres.backfill.where; give the condition the rows to backfill match, e.g. where: \"status IN ('PENDING')\"", b.OrderBy)
		}
		return errs
	}
	switch {
	case !c.Postgres.CreateSlot:
		bad("postgres.backfill", "needs postgres.create_slot: true: the backfill reads the snapshot exported when outboxd creates the slot")
	case len(c.Postgres.Tables) > 1:
		bad("postgres.backfill", "is not supported with several postgres.tables yet: backfill one table per outboxd, or send the rows with outboxd replay")
	case c.Postgres.Shards > 1:
		bad("postgres.backfill", "is not supported with postgres.shards > 1 yet: backfill with postgres.shards: 1, then reshard")
	}
	return errs
}
