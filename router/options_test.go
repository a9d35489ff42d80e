package router_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/golden"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/wal"
)

// Type OIDs of the wide table.
const (
	oidBool        = 16
	oidInt8        = 20
	oidInt4        = 23
	oidTimestamptz = 1184
	oidNumeric     = 1700
	oidDate        = 1082
)

// numeric10x8 is the type modifier of numeric(10,8).
const numeric10x8 = 10<<16 | 8 + 4

// wide is an outbox table with every kind of extra column the options use.
func wide() table {
	return newTable(
		wal.Column{Name: "id", TypeOID: oidUUID, Key: true},
		wal.Column{Name: "aggregate_type", TypeOID: oidText},
		wal.Column{Name: "aggregate_id", TypeOID: oidText},
		wal.Column{Name: "event_type", TypeOID: oidText},
		wal.Column{Name: "payload", TypeOID: oidJSONB},
		wal.Column{Name: "topic", TypeOID: oidText},
		wal.Column{Name: "tenant", TypeOID: oidText},
		wal.Column{Name: "shard", TypeOID: oidInt4},
		wal.Column{Name: "seq", TypeOID: oidInt8},
		wal.Column{Name: "urgent", TypeOID: oidBool},
		wal.Column{Name: "occurred_at", TypeOID: oidTimestamptz},
		wal.Column{Name: "occurred_ms", TypeOID: oidInt8},
		wal.Column{Name: "traceparent", TypeOID: oidText},
		wal.Column{Name: "text_payload", TypeOID: oidText},
		wal.Column{Name: "bin_payload", TypeOID: oidBytea},
		wal.Column{Name: "hdrs", TypeOID: oidJSONB},
		wal.Column{Name: "amount", TypeOID: oidNumeric},
		wal.Column{Name: "day", TypeOID: oidDate},
	)
}

func wideRow() row {
	return with(defaultRow(), "tenant", s("acme"), "shard", s("4"), "seq", s("17"), "urgent", s("t"),
		"occurred_at", s("2024-05-17 09:30:15.123456+02"), "occurred_ms", s("1715938215123"),
		"traceparent", s("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), "text_payload", s(`{"x": 1}`))
}

// TestRouteOptionsGolden covers each EventRouter option and the combinations
// that matter; poison cases end in error_.
func TestRouteOptionsGolden(t *testing.T) {
	commit := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	base := config.Default().Router
	cfg := func(mod func(*config.Router)) config.Router {
		c := base
		c.AdditionalFields = nil
		mod(&c)
		return c
	}
	deb, err := config.Load("", []string{"OUTBOXD_ROUTER_PRESET=debezium"})
	if err != nil {
		t.Fatal(err)
	}
	debTable := newTable(
		wal.Column{Name: "id", TypeOID: oidUUID, Key: true},
		wal.Column{Name: "aggregatetype", TypeOID: oidText},
		wal.Column{Name: "aggregateid", TypeOID: oidText},
		wal.Column{Name: "type", TypeOID: oidText},
		wal.Column{Name: "payload", TypeOID: oidJSONB},
	)
	debRow := row{"id": s("e-1"), "aggregatetype": s("Customer"), "aggregateid": s("c_9"), "type": s("CustomerCreated"), "payload": s(`{"name": "Ada"}`)}
	header := func(col, alias string) config.Field {
		return config.Field{Column: col, Placement: "header", Alias: alias}
	}
	envelope := func(col, alias string) config.Field {
		return config.Field{Column: col, Placement: "envelope", Alias: alias}
	}
	partition := config.Field{Column: "shard", Placement: "partition"}

	stringKey := func(col string) config.Router {
		return cfg(func(c *config.Router) { c.KeyEncoding, c.KeyColumn = "string", col })
	}
	scaled := router.KeyColumn{TypeMod: numeric10x8}
	tests := []struct {
		name string
		cfg  config.Router
		row  row
		key  router.KeyColumn // what the start-up check read of the key column
	}{
		{"preset_debezium", deb.Router, nil, router.KeyColumn{}},
		{"preset_debezium_json_key_outbox_prefix", func() config.Router {
			r := deb.Router
			r.KeyEncoding, r.TopicTemplate = "json", "outbox.event.${routedByValue}"
			return r
		}(), nil, router.KeyColumn{}},
		{"regex_group", cfg(func(c *config.Router) {
			c.TopicRegex, c.TopicTemplate = `^(?P<routedByValue>[a-z]+)_v\d+$`, "${routedByValue}-events"
		}), with(wideRow(), "aggregate_type", s("order_v2")), router.KeyColumn{}},
		{"regex_numbered_group_java_style", cfg(func(c *config.Router) {
			c.TopicRegex, c.TopicTemplate = `(.*)Aggregate`, "outbox.$1"
		}), with(wideRow(), "aggregate_type", s("OrderAggregate")), router.KeyColumn{}},
		{"regex_default_debezium", cfg(func(c *config.Router) {
			c.TopicRegex, c.TopicTemplate = `(?<routedByValue>.*)`, "outbox.event.${routedByValue}"
		}), wideRow(), router.KeyColumn{}},
		{"error_regex_no_match", cfg(func(c *config.Router) { c.TopicRegex = `^x` }), wideRow(), router.KeyColumn{}},
		{"topic_column_overrides", cfg(func(c *config.Router) { c.TopicColumn = "topic" }), with(wideRow(), "topic", s("special.topic")), router.KeyColumn{}},
		{"topic_column_null_falls_back", cfg(func(c *config.Router) { c.TopicColumn = "topic" }), wideRow(), router.KeyColumn{}},
		{"error_topic_column_invalid", cfg(func(c *config.Router) { c.TopicColumn = "topic" }), with(wideRow(), "topic", s("bad topic")), router.KeyColumn{}},
		{"header_placement_with_alias", cfg(func(c *config.Router) {
			c.AdditionalFields = []config.Field{header("tenant", "tenantId"), header("seq", "")}
		}), wideRow(), router.KeyColumn{}},
		{"header_placement_null_no_value", cfg(func(c *config.Router) { c.AdditionalFields = []config.Field{header("tenant", "")} }), with(wideRow(), "tenant", nil), router.KeyColumn{}},
		{"header_placement_bool", cfg(func(c *config.Router) { c.AdditionalFields = []config.Field{header("urgent", "")} }), wideRow(), router.KeyColumn{}},
		{"error_regex_must_match_whole_value", cfg(func(c *config.Router) {
			c.TopicRegex, c.TopicTemplate = `(.*)Aggregate`, "outbox.$1"
		}), with(wideRow(), "aggregate_type", s("OrderAggregateV2")), router.KeyColumn{}},
		{"headers_column", cfg(func(c *config.Router) { c.HeadersColumn = "hdrs" }),
			with(wideRow(), "hdrs", s(`{"a": "x", "n": 1, "z": null, "obj": {"k": [1]}, "tenant": "acme"}`)), router.KeyColumn{}},
		{"headers_column_null", cfg(func(c *config.Router) { c.HeadersColumn = "hdrs" }), wideRow(), router.KeyColumn{}},
		{"error_headers_column_not_object", cfg(func(c *config.Router) { c.HeadersColumn = "hdrs" }), with(wideRow(), "hdrs", s(`["a"]`)), router.KeyColumn{}},
		{"error_headers_column_sets_id", cfg(func(c *config.Router) { c.HeadersColumn = "hdrs" }), with(wideRow(), "hdrs", s(`{"id": "other"}`)), router.KeyColumn{}},
		{"headers_column_not_json", cfg(func(c *config.Router) { c.HeadersColumn = "tenant" }), wideRow(), router.KeyColumn{}},
		{"key_encoding_json_jackson_escapes", cfg(func(c *config.Router) { c.KeyEncoding = "json" }), with(wideRow(), "aggregate_id", s("a&b<c>\u2028\x1f\t/é")), router.KeyColumn{}},
		{"key_encoding_json_short_escapes", cfg(func(c *config.Router) { c.KeyEncoding = "json" }), with(wideRow(), "aggregate_id", s("a\"b\\c\b\f\n\r")), router.KeyColumn{}},
		{"key_encoding_json_schema", cfg(func(c *config.Router) { c.KeyEncoding = "json_schema" }), with(wideRow(), "aggregate_id", s(`o-"42"`)), router.KeyColumn{}},
		{"key_encoding_json_schema_int8", cfg(func(c *config.Router) { c.KeyEncoding, c.KeyColumn = "json_schema", "seq" }), wideRow(), router.KeyColumn{}},
		{"key_encoding_json_schema_uuid", cfg(func(c *config.Router) { c.KeyEncoding, c.KeyColumn = "json_schema", "id" }), wideRow(), router.KeyColumn{}},
		{"key_encoding_json_schema_null_key", cfg(func(c *config.Router) { c.KeyEncoding, c.RequireKey = "json_schema", false }), with(wideRow(), "aggregate_id", nil), router.KeyColumn{}},
		{"key_encoding_json_null_key", cfg(func(c *config.Router) { c.KeyEncoding, c.RequireKey = "json", false }), with(wideRow(), "aggregate_id", nil), router.KeyColumn{}},
		{"key_encoding_json_schema_timestamp_refused", cfg(func(c *config.Router) { c.KeyEncoding, c.KeyColumn = "json_schema", "occurred_at" }), wideRow(), router.KeyColumn{}},
		{"key_encoding_json_schema_numeric_refused", cfg(func(c *config.Router) { c.KeyEncoding, c.KeyColumn = "json_schema", "amount" }), wideRow(), router.KeyColumn{}},
		{"key_encoding_json_integer_key", cfg(func(c *config.Router) { c.KeyEncoding, c.KeyColumn = "json", "seq" }), wideRow(), router.KeyColumn{}},
		{"key_encoding_json_jsonb_key_quoted", cfg(func(c *config.Router) { c.KeyEncoding, c.KeyColumn = "json", "hdrs" }), with(wideRow(), "hdrs", s(`{"a": 1}`)), router.KeyColumn{}},
		{"error_headers_column_sets_event_type", cfg(func(c *config.Router) { c.HeadersColumn = "hdrs" }), with(wideRow(), "hdrs", s(`{"eventType": "other"}`)), router.KeyColumn{}},
		{"key_encoding_json_numeric_key", cfg(func(c *config.Router) { c.KeyEncoding, c.KeyColumn = "json", "amount" }), wideRow(), router.KeyColumn{}},
		{"key_encoding_json_non_bmp", cfg(func(c *config.Router) { c.KeyEncoding = "json" }), with(wideRow(), "aggregate_id", s("k\U0001F642\U00010000")), router.KeyColumn{}},
		{"key_encoding_json_schema_non_bmp", cfg(func(c *config.Router) { c.KeyEncoding = "json_schema" }), with(wideRow(), "aggregate_id", s("k\U0001F642")), router.KeyColumn{}},
		{"key_encoding_string_text_non_bmp", stringKey("aggregate_id"), with(wideRow(), "aggregate_id", s("k\U0001F642é")), router.KeyColumn{}},
		{"key_encoding_string_numeric", stringKey("amount"), with(wideRow(), "amount", s("-0.00000050")), scaled},
		{"key_encoding_string_numeric_zero", stringKey("amount"), with(wideRow(), "amount", s("0.00000000")), scaled},
		{"key_encoding_string_numeric_plain", stringKey("amount"), with(wideRow(), "amount", s("12.34000000")), scaled},
		{"error_key_encoding_string_numeric_nan", stringKey("amount"), with(wideRow(), "amount", s("NaN")), scaled},
		{"key_encoding_string_numeric_unconstrained_refused", stringKey("amount"), with(wideRow(), "amount", s("1.5")), router.KeyColumn{TypeMod: -1}},
		{"key_encoding_string_bool", stringKey("urgent"), wideRow(), router.KeyColumn{}},
		{"key_encoding_string_date", stringKey("day"), with(wideRow(), "day", s("2024-02-29")), router.KeyColumn{}},
		{"error_key_encoding_string_date_infinity", stringKey("day"), with(wideRow(), "day", s("infinity")), router.KeyColumn{}},
		{"key_encoding_string_timestamptz_refused", stringKey("occurred_at"), wideRow(), router.KeyColumn{}},
		{"envelope_jackson_escapes", cfg(func(c *config.Router) {
			c.PayloadColumn, c.AdditionalFields = "text_payload", []config.Field{envelope("tenant", "t<&>")}
		}), with(wideRow(), "text_payload", s("<&>\u2028\u2029\x1f\x7f\U0001F642\"\\/"), "tenant", s("a\x01b")), router.KeyColumn{}},
		{"key_encoding_json_schema_uuid_default", cfg(func(c *config.Router) { c.KeyEncoding, c.KeyColumn = "json_schema", "id" }), wideRow(),
			router.KeyColumn{Default: "gen_random_uuid()"}},
		{"key_encoding_json_schema_int8_default_optional", cfg(func(c *config.Router) { c.KeyEncoding, c.KeyColumn = "json_schema", "seq" }), wideRow(),
			router.KeyColumn{Optional: true, Default: "nextval('outbox_seq_seq'::regclass)"}},
		{"key_encoding_json_schema_text_default", cfg(func(c *config.Router) { c.KeyEncoding = "json_schema" }), wideRow(),
			router.KeyColumn{Default: "'a\x01\U0001F642'::text"}},
		{"key_encoding_json_schema_domain_default_refused", cfg(func(c *config.Router) { c.KeyEncoding, c.KeyColumn = "json_schema", "id" }), wideRow(),
			router.KeyColumn{Default: "gen_random_uuid()", Domain: true}},
		{"debezium_context_headers", cfg(func(c *config.Router) {
			c.DebeziumHeaders = config.DebeziumHeaders{Enabled: true, ConnectorLogicalName: "shop", TaskID: "0", ConnectorName: "postgresql", RunID: "run-7"}
			c.AdditionalFields = []config.Field{header("tenant", "")}
		}), wideRow(), router.KeyColumn{}},
		{"envelope_bytea_payload", cfg(func(c *config.Router) {
			c.PayloadColumn, c.AdditionalFields = "bin_payload", []config.Field{envelope("event_type", "type")}
		}), with(wideRow(), "bin_payload", s(`\x00fffe6162`)), router.KeyColumn{}},
		{"envelope_null_payload_is_null", cfg(func(c *config.Router) { c.AdditionalFields = []config.Field{envelope("event_type", "type")} }), with(wideRow(), "payload", nil), router.KeyColumn{}},
		{"envelope_null_payload_tombstone_on_empty", cfg(func(c *config.Router) {
			c.TombstoneOnEmptyPayload, c.AdditionalFields = true, []config.Field{envelope("event_type", "type")}
		}), with(wideRow(), "payload", nil), router.KeyColumn{}},
		{"tombstone_on_blank_bytea_payload_kept", cfg(func(c *config.Router) { c.TombstoneOnEmptyPayload, c.PayloadColumn = true, "bin_payload" }), with(wideRow(), "bin_payload", s(`\x0a`)), router.KeyColumn{}},
		{"tombstone_on_control_characters", cfg(func(c *config.Router) { c.TombstoneOnEmptyPayload, c.PayloadColumn = true, "text_payload" }), with(wideRow(), "text_payload", s("\x00\x1f ")), router.KeyColumn{}},
		{"no_tombstone_on_no_break_space", cfg(func(c *config.Router) { c.TombstoneOnEmptyPayload, c.PayloadColumn = true, "text_payload" }), with(wideRow(), "text_payload", s("\u00a0")), router.KeyColumn{}},
		{"envelope_placement", cfg(func(c *config.Router) {
			c.AdditionalFields = []config.Field{envelope("event_type", "eventType"), envelope("seq", ""), envelope("urgent", ""), envelope("tenant", ""), envelope("occurred_at", "")}
		}), wideRow(), router.KeyColumn{}},
		{"envelope_null_field", cfg(func(c *config.Router) { c.AdditionalFields = []config.Field{envelope("tenant", "")} }), with(wideRow(), "tenant", nil), router.KeyColumn{}},
		{"envelope_text_payload_as_string", cfg(func(c *config.Router) {
			c.PayloadColumn, c.AdditionalFields = "text_payload", []config.Field{envelope("event_type", "type")}
		}), wideRow(), router.KeyColumn{}},
		{"envelope_text_payload_expanded", cfg(func(c *config.Router) {
			c.PayloadColumn, c.ExpandJSONPayload, c.AdditionalFields = "text_payload", true, []config.Field{envelope("event_type", "type")}
		}), wideRow(), router.KeyColumn{}},
		{"envelope_and_header_same_column", cfg(func(c *config.Router) {
			c.AdditionalFields = []config.Field{envelope("tenant", ""), header("tenant", "")}
		}), wideRow(), router.KeyColumn{}},
		{"partition_placement", cfg(func(c *config.Router) { c.AdditionalFields = []config.Field{partition} }), wideRow(), router.KeyColumn{}},
		{"partition_null_uses_key", cfg(func(c *config.Router) { c.AdditionalFields = []config.Field{partition} }), with(wideRow(), "shard", nil), router.KeyColumn{}},
		{"error_partition_negative", cfg(func(c *config.Router) { c.AdditionalFields = []config.Field{partition} }), with(wideRow(), "shard", s("-1")), router.KeyColumn{}},
		{"error_partition_not_a_number", cfg(func(c *config.Router) {
			c.AdditionalFields = []config.Field{{Column: "tenant", Placement: "partition"}}
		}), wideRow(), router.KeyColumn{}},
		{"additional_missing_ignore", cfg(func(c *config.Router) {
			c.AdditionalMissing, c.AdditionalFields = "ignore", []config.Field{header("region", ""), envelope("nope", "")}
		}), wideRow(), router.KeyColumn{}},
		{"error_missing_additional_column", cfg(func(c *config.Router) { c.AdditionalFields = []config.Field{header("region", "")} }), wideRow(), router.KeyColumn{}},
		{"timestamp_column_timestamptz", cfg(func(c *config.Router) { c.TimestampColumn = "occurred_at" }), wideRow(), router.KeyColumn{}},
		{"timestamp_column_epoch_millis", cfg(func(c *config.Router) { c.TimestampColumn = "occurred_ms" }), wideRow(), router.KeyColumn{}},
		{"timestamp_column_null_uses_commit_time", cfg(func(c *config.Router) { c.TimestampColumn = "occurred_at" }), with(wideRow(), "occurred_at", nil), router.KeyColumn{}},
		{"error_timestamp_column_garbage", cfg(func(c *config.Router) { c.TimestampColumn = "tenant" }), wideRow(), router.KeyColumn{}},
		{"key_encoding_json", cfg(func(c *config.Router) { c.KeyEncoding = "json" }), with(wideRow(), "aggregate_id", s(`o-"42"`)), router.KeyColumn{}},
		{"expand_json_valid", cfg(func(c *config.Router) { c.ExpandJSONPayload, c.PayloadColumn = true, "text_payload" }), wideRow(), router.KeyColumn{}},
		{"expand_json_invalid_sent_as_string", cfg(func(c *config.Router) { c.ExpandJSONPayload, c.PayloadColumn = true, "text_payload" }), with(wideRow(), "text_payload", s("{not json")), router.KeyColumn{}},
		{"tombstone_on_blank_payload", cfg(func(c *config.Router) { c.TombstoneOnEmptyPayload, c.PayloadColumn = true, "text_payload" }), with(wideRow(), "text_payload", s("  ")), router.KeyColumn{}},
		{"blank_payload_kept_without_tombstones", cfg(func(c *config.Router) { c.PayloadColumn = "text_payload" }), with(wideRow(), "text_payload", s("  ")), router.KeyColumn{}},
		{"null_payload_is_tombstone", base, with(wideRow(), "payload", nil), router.KeyColumn{}},
		{"traceparent_header", cfg(func(c *config.Router) { c.TraceparentColumn = "traceparent" }), wideRow(), router.KeyColumn{}},
		{"event_type_disabled_with_dash", cfg(func(c *config.Router) { c.EventTypeColumn = "-" }), wideRow(), router.KeyColumn{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := router.New(tt.cfg, router.Schema{Key: tt.key})
			if err != nil {
				t.Fatal(err)
			}
			ch := wide().change(0x3000, tt.row)
			if strings.HasPrefix(tt.name, "preset_debezium") {
				ch = debTable.change(0x3000, debRow)
			}
			ch.CommitTime = commit
			rec, err := r.Route(ch)
			golden.Check(t, filepath.Join("testdata", "options_"+tt.name+".golden"), render(t, tt.name, rec, err))
		})
	}
}

func render(t *testing.T, name string, rec *router.Record, err error) string {
	t.Helper()
	var le *router.LayoutError
	var re *router.RowError
	switch {
	case err == nil:
		if strings.HasPrefix(name, "error_") {
			t.Errorf("routed, want an error")
		}
		return renderRecord(rec)
	case errors.As(err, &le):
		return "layout error: " + le.Error() + "\n"
	case errors.As(err, &re):
		if !strings.HasPrefix(name, "error_") {
			t.Errorf("unexpected error: %v", err)
		}
		return fmt.Sprintf("poison event_id=%q lsn=%s table=%s topic=%q\nreason: %s\nkey=%q value=%q\n", re.EventID, re.LSN, re.Table, re.Topic, re.Reason, re.Key, re.Value)
	}
	t.Fatalf("unexpected error type %T: %v", err, err)
	return ""
}

// TestRouteMessageGolden covers events written with pg_logical_emit_message.
func TestRouteMessageGolden(t *testing.T) {
	commit := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	base := config.Default().Router
	base.Messages = config.Messages{Prefix: "outbox", DefaultRouteBy: "misc"}
	base.TraceparentColumn = "traceparent"
	tests := []struct {
		name    string
		cfg     config.Router
		content string
	}{
		{"full", base, `{"id": "m-1", "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "OrderPlaced", "payload": {"total": 9.5}, "traceparent": "00-aa-bb-01"}`},
		{"string_payload_unquoted", base, `{"id": "m-2", "aggregate_type": "order", "aggregate_id": "o-1", "payload": "plain text"}`},
		{"default_route_by_and_lsn_id", base, `{"aggregate_id": "o-1", "payload": [1, 2]}`},
		{"null_payload_tombstone", base, `{"id": "m-3", "aggregate_type": "order", "aggregate_id": "o-1", "payload": null}`},
		{"error_not_json", base, `OrderPlaced o-1`},
		{"error_no_key", base, `{"id": "m-4", "aggregate_type": "order", "payload": {}}`},
		{"error_no_route_without_default", func() config.Router { c := base; c.Messages.DefaultRouteBy = ""; return c }(), `{"id": "m-5", "aggregate_id": "o-1", "payload": {}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := router.New(tt.cfg, router.Schema{})
			if err != nil {
				t.Fatal(err)
			}
			m := &wal.Message{XID: 9, LSN: 0x4000, Transactional: true, Prefix: "outbox", Content: []byte(tt.content)}
			rec, err := r.RouteMessage(m, commit)
			golden.Check(t, filepath.Join("testdata", "message_"+tt.name+".golden"), render(t, tt.name, rec, err))
		})
	}
}
