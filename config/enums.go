package config

import (
	"fmt"
	"strings"
)

// Settings with a fixed set of values are string types with a constant for
// each value. YAML and OUTBOXD_* variables set them as plain strings;
// Validate checks them all in one place, validateEnums, so that a value
// outside the set is refused before any component sees it.

// TopicCreation is kafka.topic_creation: who creates a missing topic.
type TopicCreation string

const (
	TopicCreationAdmin  TopicCreation = "admin"  // outboxd, with the admin API
	TopicCreationBroker TopicCreation = "broker" // the broker's auto.create.topics.enable
)

// Compression is kafka.compression, the codec of produced batches.
type Compression string

const (
	CompressionNone   Compression = "none"
	CompressionGzip   Compression = "gzip"
	CompressionSnappy Compression = "snappy"
	CompressionLZ4    Compression = "lz4"
	CompressionZstd   Compression = "zstd"
)

// Delivery is kafka.delivery, the delivery guarantee.
type Delivery string

const (
	AtLeastOnce Delivery = "at_least_once"
	ExactlyOnce Delivery = "exactly_once"
)

// Placement is where an additional field goes (router.additional_fields).
type Placement string

const (
	PlacementHeader    Placement = "header"
	PlacementEnvelope  Placement = "envelope"
	PlacementPartition Placement = "partition"
)

// AdditionalMissing is router.additional_missing: what a placed column
// absent from the table does.
type AdditionalMissing string

const (
	AdditionalMissingError  AdditionalMissing = "error"  // the table is refused
	AdditionalMissingIgnore AdditionalMissing = "ignore" // the field is left out
)

// KeyEncoding is router.key_encoding, the form of the record key.
type KeyEncoding string

const (
	KeyEncodingRaw        KeyEncoding = "raw"         // the key column's bytes
	KeyEncodingJSON       KeyEncoding = "json"        // JsonConverter, schemas off
	KeyEncodingJSONSchema KeyEncoding = "json_schema" // JsonConverter, schemas on
	KeyEncodingString     KeyEncoding = "string"      // StringConverter: Java's toString of Debezium's value
)

// OnUpdate is router.on_update: what an UPDATE of an outbox row does.
type OnUpdate string

const (
	OnUpdateIgnore OnUpdate = "ignore"
	OnUpdateWarn   OnUpdate = "warn"
	OnUpdateError  OnUpdate = "error" // outboxd stops
)

// Unowned is router.messages.unowned: what a logical message that names no
// outbox table does.
type Unowned string

const (
	UnownedDeliver Unowned = "deliver" // this outboxd delivers it
	UnownedIgnore  Unowned = "ignore"  // another outboxd on the database does
)

// PoisonPolicy is router.poison.policy: what a row that cannot be routed
// does.
type PoisonPolicy string

const (
	PoisonHalt PoisonPolicy = "halt" // outboxd stops at the row
	PoisonDLQ  PoisonPolicy = "dlq"  // the row goes to router.poison.dlq_topic
)

// LogLevel is log.level.
type LogLevel string

const (
	LogDebug LogLevel = "debug"
	LogInfo  LogLevel = "info"
	LogWarn  LogLevel = "warn"
	LogError LogLevel = "error"
)

// LogFormat is log.format.
type LogFormat string

const (
	LogText LogFormat = "text"
	LogJSON LogFormat = "json"
)

// explain adds what the values mean to err, if there is one.
func explain(err error, meaning string) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w (%s)", err, meaning)
}

// validateEnums checks every setting with a fixed set of values.
func (c Config) validateEnums() []error {
	errs := []error{
		explain(oneOf("kafka.topic_creation", c.Kafka.TopicCreation, TopicCreationAdmin, TopicCreationBroker),
			"admin: outboxd creates missing topics; broker: the brokers' auto.create.topics.enable does"),
		oneOf("kafka.compression", c.Kafka.Compression, CompressionNone, CompressionGzip, CompressionSnappy, CompressionLZ4, CompressionZstd),
		oneOf("kafka.delivery", c.Kafka.Delivery, AtLeastOnce, ExactlyOnce),
		oneOf("log.level", c.Log.Level, LogDebug, LogInfo, LogWarn, LogError),
		oneOf("log.format", c.Log.Format, LogText, LogJSON),
	}
	return nonNil(append(errs, c.Router.validateEnums()...))
}

// validateEnums checks the router settings with a fixed set of values.
func (r Router) validateEnums() []error {
	errs := []error{
		oneOf("router.additional_missing", r.AdditionalMissing, AdditionalMissingError, AdditionalMissingIgnore),
		oneOf("router.key_encoding", r.KeyEncoding, KeyEncodingRaw, KeyEncodingJSON, KeyEncodingJSONSchema, KeyEncodingString),
		oneOf("router.on_update", r.OnUpdate, OnUpdateIgnore, OnUpdateWarn, OnUpdateError),
		explain(oneOf("router.messages.unowned", r.Messages.Unowned, UnownedDeliver, UnownedIgnore),
			"what a logical message that names no outbox table does; one outboxd on the database should deliver them"),
		oneOf("router.poison.policy", r.Poison.Policy, PoisonHalt, PoisonDLQ),
	}
	for i, f := range r.AdditionalFields {
		errs = append(errs, oneOf(fmt.Sprintf("router.additional_fields[%d].placement", i), f.Placement,
			PlacementHeader, PlacementEnvelope, PlacementPartition))
	}
	return nonNil(errs)
}

// nonNil returns the errors of errs that are not nil.
func nonNil(errs []error) []error {
	out := errs[:0]
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// oneOf returns an error naming field and the allowed values unless v is one
// of them.
func oneOf[T ~string](field string, v T, allowed ...T) error {
	names := make([]string, len(allowed))
	for i, a := range allowed {
		if v == a {
			return nil
		}
		names[i] = string(a)
	}
	list := names[0]
	if n := len(names); n > 1 {
		list = strings.Join(names[:n-1], ", ") + " or " + names[n-1]
	}
	return fmt.Errorf("%s: %q must be %s", field, v, list)
}
