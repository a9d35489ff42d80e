package router

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/wal"
)

// Placeholder in a topic template for the route-by column's value, as in
// Debezium's route.topic.replacement.
const Placeholder = "${routedByValue}"

// TraceparentHeader is the W3C trace context header.
const TraceparentHeader = "traceparent"

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is a routed outbox row. Its key, value, header values and event id
// may alias the bytes of the change (or message) it was routed from, which
// must never be written afterwards; package wal's never are.
type Record struct {
	Topic   string
	Key     []byte // nil when the key is NULL
	Value   []byte // nil for a tombstone
	Headers []Header
	EventID string
	// Partition is the partition chosen by a column placed as partition, or
	// -1: Kafka's murmur2 of the key decides.
	Partition int32
	// Timestamp is the record's timestamp: the timestamp column, else the
	// transaction's commit time.
	Timestamp time.Time
	// CommitTime is the commit time of the row's transaction.
	CommitTime time.Time

	hdrs [3]Header // backing array for the usual headers: one allocation less
}

// Size is the bytes of the record's key, value and headers: what
// kafka.max_message_bytes and kafka.transaction_max_bytes count.
func (r *Record) Size() int {
	size := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		size += len(h.Key) + len(h.Value)
	}
	return size
}

// RowError reports an outbox row (or message) that cannot be routed: a
// poison row. The caller halts or dead-letters it, never skips it.
type RowError struct {
	EventID string
	LSN     wal.LSN
	Table   string
	Topic   string // the intended topic, when known
	Reason  string
	// Key and Value are the row's key and payload bytes, and EventType its
	// event type ("" when NULL or not configured), for a dead letter.
	Key, Value []byte
	EventType  string
	// Headers are the headers of the routed record, when routing got that
	// far (nil otherwise), for a dead letter.
	Headers []Header
}

func (e *RowError) Error() string {
	id := e.EventID
	if id == "" {
		id = "(unknown)"
	}
	return fmt.Sprintf("cannot route outbox row %s at LSN %s in %s: %s", id, e.LSN, e.Table, e.Reason)
}

// Permanent reports that a restart cannot fix it: the row is routed again
// as it is. (The caller may dead-letter it instead.)
func (e *RowError) Permanent() bool { return true }

// LayoutError reports a table that lacks a configured column, or has one of
// a type the settings cannot use. It is a configuration error, not a poison
// row: no row of that table can be routed.
type LayoutError struct {
	Table   string
	Missing []string
	// Reason, when set, says what is wrong with a column that is present.
	Reason string
}

func (e *LayoutError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("outbox table %s: %s", e.Table, e.Reason)
	}
	return fmt.Sprintf("outbox table %s has no column %s; add it or set the router.*_column settings to the table's column names",
		e.Table, strings.Join(e.Missing, ", "))
}

// Permanent reports that a restart cannot fix it: the settings or the
// table must change.
func (e *LayoutError) Permanent() bool { return true }

// The fields a row is read into; additional fields follow.
const (
	fID = iota
	fRouteBy
	fKey
	fPayload
	fEventType
	fTimestamp
	fTraceparent
	fTopic
	fHeaders
	nFixed
)

// cell is one field of a row, already converted to delivered bytes.
type cell struct {
	data    []byte
	null    bool
	missing bool   // the table or message has no such field
	json    bool   // data is JSON (json/jsonb column or non-string message field)
	oid     uint32 // Postgres type, 0 for message fields
}

// Router routes rows; see the package documentation.
type Router struct {
	cfg      config.Router
	names    []string       // field names: the configured columns, then additional fields
	parts    []string       // the template split around Placeholder
	re       *regexp.Regexp // topic_regex, anchored: it must match the whole value
	envelope bool
	rel      *wal.Relation
	table    string            // rel's qualified name
	layout   []int             // field -> column index of rel, -1 when absent
	types    []uint32          // field -> the base type of its column in rel
	bases    map[uint32]uint32 // domain type OID -> its base type
	cells    []cell
	key      KeyColumn // what the start-up check read of the key column
	// keyDefault is the "default" of Debezium's key schema (JSON), nil for
	// none; set by checkTypes under key_encoding json_schema.
	keyDefault []byte
	context    []Header          // Debezium's context headers (router.debezium_headers), first on every record
	topics     map[string]string // route-by value -> checked topic, bounded by maxTopicCache
}

// maxTopicCache bounds the route-by value -> topic cache; past it the cache
// starts afresh.
const maxTopicCache = 4096

// Schema is what the catalogue says of the outbox table beyond its
// relation, which routing depends on: the start-up checks read it
// (package internal/preflight), and a run adds the domains it meets.
type Schema struct {
	Key KeyColumn
	// Bases maps a domain's type OID to its base type, so that a column
	// of the domain is read as the base type: pgoutput names the domain.
	Bases map[uint32]uint32
}

// New returns a Router for a validated cfg and the table schema (the zero
// Schema when the catalogue was not read).
func New(cfg config.Router, schema Schema) (*Router, error) {
	if cfg.TopicTemplate == "" {
		return nil, fmt.Errorf("router: empty topic template")
	}
	r := &Router{cfg: cfg, parts: strings.Split(cfg.TopicTemplate, Placeholder), key: schema.Key, bases: schema.Bases}
	if cfg.TopicRegex != "" {
		// Kafka's RegexRouter, which Debezium's EventRouter uses, rewrites
		// only a value the regex matches as a whole (Matcher.matches).
		re, err := regexp.Compile(`^(?:` + cfg.TopicRegex + `)$`)
		if err != nil {
			return nil, fmt.Errorf("router.topic_regex: %w", err)
		}
		r.re = re
	}
	r.names = fieldNames(cfg)
	for _, f := range cfg.AdditionalFields {
		r.envelope = r.envelope || f.Placement == config.PlacementEnvelope
	}
	r.cells = make([]cell, len(r.names))
	r.topics = make(map[string]string)
	if h := cfg.DebeziumHeaders; h.Enabled {
		runID := h.RunID
		if runID == "" {
			runID = RunID()
		}
		r.context = []Header{
			{Key: "__debezium.context.connectorLogicalName", Value: []byte(h.ConnectorLogicalName)},
			{Key: "__debezium.context.taskId", Value: []byte(h.TaskID)},
			{Key: "__debezium.context.connectorName", Value: []byte(h.ConnectorName)},
			{Key: "__debezium.context.runId", Value: []byte(runID)},
		}
	}
	return r, nil
}

// fieldNames returns the names of the fields a row is read into: the
// configured columns ("" for none), then the additional fields.
func fieldNames(cfg config.Router) []string {
	optional := func(s string) string {
		if s == "-" {
			return ""
		}
		return s
	}
	names := []string{cfg.IDColumn, cfg.RouteByColumn, cfg.KeyColumn, cfg.PayloadColumn,
		optional(cfg.EventTypeColumn), cfg.TimestampColumn, cfg.TraceparentColumn, cfg.TopicColumn, cfg.HeadersColumn}
	for _, f := range cfg.AdditionalFields {
		names = append(names, f.Column)
	}
	return names
}

// RunID returns a new run id for Debezium's context headers (a random,
// version 4 UUID in its text form), for a router.debezium_headers.run_id
// that is empty: a caller that builds several Routers for one run sets it
// once.
func RunID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0F | 0x40
	b[8] = b[8]&0x3F | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Columns returns the columns a table must have for a Router of cfg to
// route its rows.
func Columns(cfg config.Router) []string {
	var cols []string
	for i, n := range fieldNames(cfg) {
		if n != "" && (i < nFixed || cfg.AdditionalMissing == config.AdditionalMissingError) {
			cols = append(cols, n)
		}
	}
	return cols
}

func (r *Router) layoutFor(rel *wal.Relation) ([]int, error) {
	if rel == r.rel {
		return r.layout, nil
	}
	layout := make([]int, len(r.names))
	var missing []string
	for i, n := range r.names {
		layout[i] = -1
		if n == "" {
			continue
		}
		if layout[i] = rel.Index(n); layout[i] < 0 && (i < nFixed || r.cfg.AdditionalMissing == config.AdditionalMissingError) {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return nil, &LayoutError{Table: rel.QualifiedName(), Missing: missing}
	}
	types := make([]uint32, len(layout))
	for i, col := range layout {
		if col >= 0 {
			types[i] = rel.Columns[col].TypeOID
			if base, ok := r.bases[types[i]]; ok {
				types[i] = base
			}
		}
	}
	if err := r.checkTypes(rel.QualifiedName(), func(f int) uint32 { return types[f] }); err != nil {
		return nil, err
	}
	r.rel, r.layout, r.types, r.table = rel, layout, types, rel.QualifiedName()
	return layout, nil
}

// CheckTypes checks the base types of table's columns (by name) against the
// settings, as routing its first row would: the start-up check calls it so
// that a column of a type the router refuses stops outboxd before any row.
func (r *Router) CheckTypes(table string, types map[string]uint32) error {
	return r.checkTypes(table, func(f int) uint32 { return types[r.names[f]] })
}

// checkTypes refuses column types the settings cannot route faithfully;
// typeOf gives a field's base type.
func (r *Router) checkTypes(table string, typeOf func(field int) uint32) error {
	if t := typeOf(fHeaders); r.names[fHeaders] != "" && t != oidJSON && t != oidJSONB {
		return &LayoutError{Table: table, Reason: fmt.Sprintf(
			"column %s (router.headers_column) must be of type json or jsonb, holding an object whose members become headers", r.names[fHeaders])}
	}
	enc := r.cfg.KeyEncoding
	if t := typeOf(fKey); enc == config.KeyEncodingString {
		if reason := r.stringKeyRefusal(t); reason != "" {
			return &LayoutError{Table: table, Reason: fmt.Sprintf(
				"key column %s: %s; router.key_encoding string cannot write the key Kafka Connect's StringConverter wrote. "+
					"Use a text, uuid, integer, boolean, date or numeric(p,s) key column, or key_encoding raw (keys then move to other partitions)",
				r.names[fKey], reason)}
		}
	}
	if enc == config.KeyEncodingJSON || enc == config.KeyEncodingJSONSchema {
		if name, ok := jsonKeyRefused[typeOf(fKey)]; ok {
			return &LayoutError{Table: table, Reason: fmt.Sprintf(
				"key column %s is %s, which router.key_encoding %s cannot encode as Debezium would; use a text, uuid or integer key column, or key_encoding raw",
				r.names[fKey], name, enc)}
		}
	}
	if t := typeOf(fKey); enc == config.KeyEncodingJSONSchema && !jsonSchemaKeyTypes[t] {
		return &LayoutError{Table: table, Reason: fmt.Sprintf(
			"key column %s has a type (OID %d) without a Connect schema for router.key_encoding json_schema; "+
				"use a text, varchar, char, uuid, integer, boolean, json or jsonb key column, or key_encoding json or raw", r.names[fKey], t)}
	}
	if enc == config.KeyEncodingJSONSchema {
		def, err := keyDefault(r.key.Default, typeOf(fKey), r.key.Domain)
		if err != nil {
			return &LayoutError{Table: table, Reason: fmt.Sprintf(
				"key column %s has a DEFAULT, which Debezium put into the key's schema, and %v, so keys would land on other partitions; "+
					"drop the default or use key_encoding json or raw", r.names[fKey], err)}
		}
		r.keyDefault = def
	}
	return nil
}

// jsonKeyRefused names the key column types key_encoding json refuses.
var jsonKeyRefused = map[uint32]string{
	oidNumeric: "numeric", oidFloat4: "real", oidFloat8: "double precision", oidBytea: "bytea", oidDate: "date",
	oidTime: "time", oidTimetz: "timetz", oidTimestamp: "timestamp", oidTimestamptz: "timestamptz",
	oidInterval: "interval", oidMoney: "money",
}

// jsonSchemaKeyTypes are the key column types whose Connect schema
// key_encoding json_schema writes as Debezium mapped them.
var jsonSchemaKeyTypes = map[uint32]bool{
	oidText: true, oidVarchar: true, oidBpchar: true, oidUUID: true, oidInt2: true, oidInt4: true, oidInt8: true,
	oidBool: true, oidJSON: true, oidJSONB: true,
}

// KeyColumn is what the catalog says of the key column beyond its type,
// which Debezium's key depends on.
type KeyColumn struct {
	// Optional says the column may be NULL: Debezium's key schema is
	// optional then (key_encoding json_schema).
	Optional bool
	// TypeMod is the column's type modifier (through domains): a numeric's
	// declared precision and scale. 0 or -1 when it has none.
	TypeMod int32
	// Default is the column's DEFAULT expression as Postgres prints it
	// (pg_get_expr), "" when it has none.
	Default string
	// Domain says the column's declared type is a domain.
	Domain bool
}

// stringKeyRefusal says why key_encoding string cannot reproduce
// StringConverter's bytes for a key column of type oid, or "" when it can:
// Java's toString of the value Debezium (with its default
// decimal.handling.mode, time.precision.mode and binary.handling.mode)
// made of the column.
func (r *Router) stringKeyRefusal(oid uint32) string {
	switch oid {
	case oidText, oidVarchar, oidBpchar, oidUUID, oidInt2, oidInt4, oidInt8, oidBool, oidJSON, oidJSONB, oidDate:
		return ""
	case oidNumeric:
		if r.key.TypeMod > 0 {
			return ""
		}
		return "it is a numeric without a declared scale, which Debezium sends as a VariableScaleDecimal struct whose toString holds a Java object hash; declare it numeric(p,s)"
	case oidFloat4, oidFloat8:
		return "it is floating point, whose Java toString changed with the JVM (JDK 19)"
	case oidTime, oidTimetz, oidTimestamp, oidTimestamptz, oidInterval:
		return "it is a time type, whose Debezium form depends on time.precision.mode and interval.handling.mode"
	case oidBytea:
		return "it is bytea, which Debezium sends as bytes whose toString is a Java object reference"
	case oidMoney:
		return "it is money, whose text depends on the server's lc_monetary"
	}
	return fmt.Sprintf("its type (OID %d) has no Debezium toString that outboxd reproduces", oid)
}

// Route maps one inserted outbox row to a record. It returns a *RowError for
// a poison row and a *LayoutError for a table that lacks a column.
func (r *Router) Route(c *wal.Change) (*Record, error) {
	rec := new(Record)
	if err := r.RouteInto(c, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// RouteInto is Route writing the record into rec, so that a caller that is
// done with each record before routing the next needs no allocation. rec
// holds the row's record only when the error is nil.
func (r *Router) RouteInto(c *wal.Change, rec *Record) error {
	layout, err := r.layoutFor(c.Relation)
	if err != nil {
		return err
	}
	var convErr error
	for i, col := range layout {
		if col < 0 {
			r.cells[i] = cell{missing: true, null: true}
			continue
		}
		rc := c.Relation.Columns[col]
		rc.TypeOID = r.types[i]
		data, err := rc.Value(c.Tuple[col])
		if err != nil && convErr == nil {
			convErr = err
		}
		r.cells[i] = cell{data: data, null: data == nil, json: rc.TypeOID == oidJSON || rc.TypeOID == oidJSONB, oid: rc.TypeOID}
	}
	if convErr != nil {
		return &RowError{EventID: string(r.cells[fID].data), LSN: c.LSN, Table: r.table, Reason: convErr.Error()}
	}
	return r.build(rec, c.LSN, r.table, c.CommitTime)
}

// RouteMessage maps a logical decoding message to a record. Its content is a
// JSON object whose fields are named like the configured columns.
func (r *Router) RouteMessage(m *wal.Message, commitTime time.Time) (*Record, error) {
	fields, err := ParseMessage(m)
	if err != nil {
		return nil, err
	}
	return r.RouteFields(m, fields, commitTime)
}

// OwnerField is the field of a logical message's content that names the
// outbox table the message belongs to, schema-qualified (package outbox
// writes it, from a Config.Table set explicitly): only the outboxd whose
// postgres.table it names delivers the message. A message without it (or
// with null or "") names none. It is not delivered itself.
const OwnerField = "__outbox_table"

// MessageFields is a logical message's content: a JSON object's fields by
// name, parsed once for its owner, its key and its routing.
type MessageFields map[string]json.RawMessage

// ParseMessage parses m's content. Content that is not a JSON object, or
// whose OwnerField is not a string (nor null), is a *RowError, a poison row;
// the fields are then nil, which name no owner and no key.
func ParseMessage(m *wal.Message) (MessageFields, error) {
	var fields MessageFields
	source := "message " + strconv.Quote(m.Prefix)
	if err := json.Unmarshal(m.Content, &fields); err != nil {
		return nil, &RowError{LSN: m.LSN, Table: source, Reason: "content is not a JSON object: " + err.Error(), Value: m.Content}
	}
	if raw, ok := fields[OwnerField]; ok && len(raw) > 0 && raw[0] != '"' && !bytes.Equal(raw, []byte("null")) {
		return nil, &RowError{LSN: m.LSN, Table: source, Value: m.Content,
			Reason: fmt.Sprintf("field %s is %s, not a string: it names the outbox table the message belongs to (\"schema.table\"), or is left out for none", OwnerField, raw)}
	}
	return fields, nil
}

// Text returns field name as the router reads it before key_encoding: a JSON
// string's text, or any other JSON value's own text. ok is false when the
// field is missing or null, or a string that does not decode.
func (f MessageFields) Text(name string) (text []byte, ok bool) {
	raw, ok := f[name]
	if !ok || len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, false
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil, false
		}
		return []byte(s), true
	}
	return raw, true
}

// Owner returns the outbox table the message names (OwnerField),
// schema-qualified ("public." is added to a name without a schema), or ""
// when it names none (the field missing, null or ""). Nothing else is
// normalised: the caller compares it with postgres.table exactly.
func (f MessageFields) Owner() string {
	owner, ok := f.Text(OwnerField)
	if !ok || len(owner) == 0 {
		return ""
	}
	if !bytes.ContainsRune(owner, '.') {
		return "public." + string(owner)
	}
	return string(owner)
}

// RouteFields routes a logical message whose content ParseMessage parsed
// into fields.
func (r *Router) RouteFields(m *wal.Message, fields MessageFields, commitTime time.Time) (*Record, error) {
	source := "message " + strconv.Quote(m.Prefix)
	for i, n := range r.names {
		raw, ok := fields[n]
		switch {
		case n == "" || !ok:
			r.cells[i] = cell{missing: true, null: true}
		case bytes.Equal(raw, []byte("null")):
			r.cells[i] = cell{null: true}
		case raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, &RowError{LSN: m.LSN, Table: source, Reason: fmt.Sprintf("field %s: %v", n, err)}
			}
			r.cells[i] = cell{data: []byte(s)}
		default:
			r.cells[i] = cell{data: raw, json: true}
		}
	}
	if r.cells[fID].null {
		// A message's position identifies it across replays.
		r.cells[fID] = cell{data: []byte("lsn-" + m.LSN.String())}
	}
	if r.cells[fRouteBy].null && r.cfg.Messages.DefaultRouteBy != "" {
		r.cells[fRouteBy] = cell{data: []byte(r.cfg.Messages.DefaultRouteBy)}
	}
	rec := new(Record)
	if err := r.build(rec, m.LSN, source, commitTime); err != nil {
		return nil, err
	}
	return rec, nil
}

// build writes the record made from r.cells into rec.
func (r *Router) build(rec *Record, lsn wal.LSN, source string, commitTime time.Time) error {
	cells := r.cells
	*rec = Record{EventID: unsafeString(cells[fID].data), Partition: -1, Timestamp: commitTime, CommitTime: commitTime}
	fail := func(topic, format string, args ...any) error {
		return &RowError{EventID: string(cells[fID].data), LSN: lsn, Table: source, Topic: topic,
			Reason: fmt.Sprintf(format, args...), Key: cells[fKey].data, Value: cells[fPayload].data,
			EventType: string(cells[fEventType].data)}
	}
	if cells[fID].null {
		return fail("", "column %s is NULL; every outbox row needs an event id", r.cfg.IDColumn)
	}

	switch {
	case !cells[fTopic].null:
		rec.Topic = string(cells[fTopic].data)
		if err := checkTopic(rec.Topic); err != nil {
			return fail(rec.Topic, "topic %q from column %s: %v", rec.Topic, r.cfg.TopicColumn, err)
		}
	case cells[fRouteBy].null:
		return fail("", "column %s is NULL, so there is no topic to route to", r.cfg.RouteByColumn)
	default:
		if t, ok := r.topics[string(cells[fRouteBy].data)]; ok {
			rec.Topic = t
			break
		}
		topic, err := r.topic(cells[fRouteBy].data)
		if err != nil {
			return fail("", "%v", err)
		}
		if err := checkTopic(topic); err != nil {
			return fail(topic, "topic %q from column %s: %v", topic, r.cfg.RouteByColumn, err)
		}
		if len(r.topics) >= maxTopicCache {
			clear(r.topics)
		}
		r.topics[string(cells[fRouteBy].data)] = topic
		rec.Topic = topic
	}

	switch key := cells[fKey]; {
	case key.null && r.cfg.RequireKey:
		return fail(rec.Topic, "column %s is NULL; a key is required (router.require_key) so that the events of an aggregate stay in order", r.cfg.KeyColumn)
	case key.null && r.cfg.KeyEncoding == config.KeyEncodingJSON:
		rec.Key = []byte("null") // JsonConverter serialized a null of an optional schema so
	case key.null && r.cfg.KeyEncoding == config.KeyEncodingJSONSchema:
		rec.Key = r.appendJSONSchemaKey(nil, key)
	case key.null:
	case r.cfg.KeyEncoding == config.KeyEncodingJSON:
		rec.Key = appendJSONKey(nil, key)
	case r.cfg.KeyEncoding == config.KeyEncodingJSONSchema:
		rec.Key = r.appendJSONSchemaKey(nil, key)
	case r.cfg.KeyEncoding == config.KeyEncodingString:
		k, ok := appendStringKey(nil, key)
		if !ok {
			return fail(rec.Topic, "column %s holds %q, which Debezium does not send as a %s; key_encoding string cannot write the key StringConverter wrote",
				r.cfg.KeyColumn, key.data, typeName(key.oid))
		}
		rec.Key = k
	default:
		rec.Key = key.data
	}

	// As Debezium's EventRouter: a NULL or blank payload is a tombstone
	// with route.tombstone.on.empty.payload; otherwise a NULL payload is a
	// null value, or null in the envelope. Blank is Java's trim() of the
	// string: nothing above U+0020. A bytea payload is never blank.
	// With expand_json_payload (whose values JsonConverter wrote), a NULL
	// payload is the JSON null, not a tombstone.
	payload := cells[fPayload]
	blank := !payload.null && payload.oid != oidBytea && javaBlank(payload.data)
	expand := r.cfg.ExpandJSONPayload && payload.oid != 0 // a message's payload field is JSON already
	tombstone := (payload.null || blank) && r.cfg.TombstoneOnEmptyPayload || payload.null && !r.envelope && !expand
	switch {
	case tombstone:
	case expand:
		v, err := r.expandedValue(payload)
		if err != nil {
			return fail(rec.Topic, "column %s with router.expand_json_payload: %v", r.cfg.PayloadColumn, err)
		}
		rec.Value = v
	case r.envelope:
		rec.Value = r.envelopeOf(payload, nil)
	default:
		rec.Value = payload.data
	}

	rec.Headers = rec.hdrs[:0]
	// Debezium's context headers came with the change record, before the
	// EventRouter added its own.
	rec.Headers = append(rec.Headers, r.context...)
	rec.Headers = append(rec.Headers, Header{Key: r.cfg.IDHeader, Value: cells[fID].data})
	// The event type is a header placement in Debezium, which sends a
	// NULL column as a header without a value.
	if et := cells[fEventType]; !et.missing {
		rec.Headers = append(rec.Headers, Header{Key: r.cfg.EventTypeHeader, Value: headerValue(et)})
	}
	if tp := cells[fTraceparent]; !tp.null {
		rec.Headers = append(rec.Headers, Header{Key: TraceparentHeader, Value: tp.data})
	}
	for i, f := range r.cfg.AdditionalFields {
		c := cells[nFixed+i]
		switch {
		case c.missing:
		case f.Placement == config.PlacementHeader:
			rec.Headers = append(rec.Headers, Header{Key: alias(f), Value: headerValue(c)})
		case f.Placement == config.PlacementPartition && !c.null:
			p, err := strconv.ParseInt(string(c.data), 10, 32)
			if err != nil || p < 0 {
				return fail(rec.Topic, "column %s placed as partition holds %q, not a partition number", f.Column, c.data)
			}
			rec.Partition = int32(p)
		}
	}
	if h := cells[fHeaders]; !h.null {
		var err error
		if rec.Headers, err = r.appendHeaders(rec.Headers, h); err != nil {
			return fail(rec.Topic, "column %s (router.headers_column): %v", r.cfg.HeadersColumn, err)
		}
	}
	if ts := cells[fTimestamp]; !ts.null {
		t, err := parseTimestamp(ts.data, ts.oid)
		if err != nil {
			return fail(rec.Topic, "column %s: %v", r.cfg.TimestampColumn, err)
		}
		rec.Timestamp = t
	}
	return nil
}

// unsafeString returns b as a string without copying it: one allocation
// less per event. b must never be written afterwards (see Record).
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

func alias(f config.Field) string {
	if f.Alias != "" {
		return f.Alias
	}
	return f.Column
}

// expandedValue is the value Debezium's expansion of the payload made, as
// JsonConverter (schemas off) wrote it, in the envelope if there is one.
func (r *Router) expandedValue(payload cell) ([]byte, error) {
	var v []byte
	switch {
	case payload.null:
		v = []byte("null")
	case payload.oid == oidBytea: // not a string: Debezium does not expand it
		v = appendJacksonBinary(nil, payload.data)
	default:
		var err error
		if v, err = appendExpanded(nil, payload.data); err != nil {
			return nil, err
		}
	}
	if r.envelope {
		return r.envelopeOf(payload, v), nil
	}
	return v, nil
}

// envelopeOf wraps the payload in an object with the envelope fields, as
// Kafka Connect's JsonConverter (schemas off) writes Debezium's envelope;
// expanded, when not nil, is the payload's JSON.
func (r *Router) envelopeOf(payload cell, expanded []byte) []byte {
	dst := append([]byte(nil), `{"payload":`...)
	if expanded != nil {
		dst = append(dst, expanded...)
	} else {
		dst = appendJSONValue(dst, payload)
	}
	for i, f := range r.cfg.AdditionalFields {
		if f.Placement != config.PlacementEnvelope || r.cells[nFixed+i].missing {
			continue
		}
		dst = append(dst, ',')
		dst = appendJacksonString(dst, []byte(alias(f)))
		dst = append(dst, ':')
		dst = appendJSONValue(dst, r.cells[nFixed+i])
	}
	return append(dst, '}')
}

// Type OIDs the router converts.
const (
	oidBool        = 16
	oidBytea       = 17
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidJSON        = 114
	oidMoney       = 790
	oidDate        = 1082
	oidTime        = 1083
	oidInterval    = 1186
	oidTimetz      = 1266
	oidFloat4      = 700
	oidFloat8      = 701
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidNumeric     = 1700
	oidJSONB       = 3802
	oidUUID        = 2950
	oidText        = 25
	oidBpchar      = 1042
	oidVarchar     = 1043
)

// appendJSONValue appends a field of Debezium's envelope as JsonConverter
// (schemas off) writes the value Debezium made of the column: integers
// and booleans bare, bytea as base64, json and jsonb (Debezium's Json is a
// string) and text as strings escaped as Jackson escapes them. A
// message's non-string field is JSON already.
func appendJSONValue(dst []byte, c cell) []byte {
	switch {
	case c.null:
		return append(dst, "null"...)
	case c.json && c.oid == 0:
		return append(dst, c.data...)
	case c.oid == oidInt2 || c.oid == oidInt4 || c.oid == oidInt8 || c.oid == oidFloat4 || c.oid == oidFloat8 || c.oid == oidNumeric:
		return append(dst, c.data...)
	case c.oid == oidBool:
		return strconv.AppendBool(dst, string(c.data) == "t")
	case c.oid == oidBytea:
		return appendJacksonBinary(dst, c.data)
	}
	return appendJacksonString(dst, c.data)
}

// headerValue is a column's header value: nil for NULL (a header without a
// value, as Kafka Connect sends a null header), true or false for a
// boolean (as its SimpleHeaderConverter writes one), else the text form.
func headerValue(c cell) []byte {
	switch {
	case c.null:
		return nil
	case c.oid == oidBool && string(c.data) == "t":
		return []byte("true")
	case c.oid == oidBool && string(c.data) == "f":
		return []byte("false")
	}
	return c.data
}

// appendHeaders appends a headers column's members: a JSON object, string
// values as their text, other values as their JSON, null as no value.
func (r *Router) appendHeaders(hs []Header, c cell) ([]Header, error) {
	d := json.NewDecoder(bytes.NewReader(c.data))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return hs, fmt.Errorf("%.60q is not a JSON object", c.data)
	}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return hs, fmt.Errorf("not a JSON object: %v", err)
		}
		key := t.(string) // object keys are strings
		switch {
		case key == r.cfg.IDHeader:
			return hs, fmt.Errorf("member %q would repeat the header outboxd sets from column %s; rename the member", key, r.cfg.IDColumn)
		case key == r.cfg.EventTypeHeader && r.names[fEventType] != "":
			return hs, fmt.Errorf("member %q would repeat the header outboxd sets from column %s; rename the member", key, r.names[fEventType])
		}
		var raw json.RawMessage
		if err := d.Decode(&raw); err != nil {
			return hs, fmt.Errorf("not a JSON object: %v", err)
		}
		var v []byte
		switch raw[0] {
		case 'n':
		case '"':
			var str string
			_ = json.Unmarshal(raw, &str) // a decoded JSON string
			v = []byte(str)
		default:
			v = raw
		}
		hs = append(hs, Header{Key: key, Value: v})
	}
	return hs, nil
}

// javaBlank reports whether Java's String.trim() leaves nothing of b, as
// Debezium judges an empty payload: every byte is U+0020 or below.
func javaBlank(b []byte) bool {
	for _, c := range b {
		if c > ' ' {
			return false
		}
	}
	return true
}

// appendJSONKey appends the key as Kafka Connect's JsonConverter (schemas
// off) wrote it: integers and booleans bare, anything else as a JSON
// string escaped as Jackson escapes it.
func appendJSONKey(dst []byte, c cell) []byte {
	switch {
	case c.json && c.oid == 0, c.oid == oidInt2 || c.oid == oidInt4 || c.oid == oidInt8:
		// A message's non-string field is JSON already; a json or jsonb
		// column is a string to Debezium, quoted below.
		return append(dst, c.data...)
	case c.oid == oidBool:
		if string(c.data) == "t" {
			return append(dst, "true"...)
		}
		return append(dst, "false"...)
	}
	return appendJacksonString(dst, c.data)
}

// appendStringKey appends the key as Kafka Connect's StringConverter wrote
// Debezium's: Java's toString of the value Debezium made of the column
// (booleans true and false, a numeric's BigDecimal, a date's days since
// 1970); a message's field as its text. It reports false for a value
// Debezium does not send as such (NaN, infinity).
func appendStringKey(dst []byte, c cell) ([]byte, bool) {
	switch c.oid {
	case oidBool:
		return strconv.AppendBool(dst, string(c.data) == "t"), true
	case oidNumeric:
		return appendBigDecimal(dst, c.data)
	case oidDate:
		return appendEpochDay(dst, c.data)
	}
	return append(dst, c.data...), true
}

// typeName names the types whose values appendStringKey can refuse.
func typeName(oid uint32) string {
	if oid == oidDate {
		return "date"
	}
	return "number"
}

// appendJSONSchemaKey appends the key as Kafka Connect's JsonConverter with
// schemas on wrote Debezium's key: an envelope of the key column's Connect
// schema (as Debezium maps the column type) and the value,
// {"schema":{"type":"string","optional":false},"payload":"42"}.
func (r *Router) appendJSONSchemaKey(dst []byte, c cell) []byte {
	typ, name := "string", ""
	switch c.oid {
	case oidInt2:
		typ = "int16"
	case oidInt4:
		typ = "int32"
	case oidInt8:
		typ = "int64"
	case oidBool:
		typ = "boolean"
	case oidUUID:
		name = "io.debezium.data.Uuid"
	case oidJSON, oidJSONB:
		name = "io.debezium.data.Json"
	}
	dst = append(dst, `{"schema":{"type":"`...)
	dst = append(dst, typ...)
	dst = append(dst, `","optional":`...)
	dst = strconv.AppendBool(dst, r.key.Optional)
	if name != "" {
		dst = append(dst, `,"name":"`...)
		dst = append(dst, name...)
		dst = append(dst, `","version":1`...)
	}
	if r.keyDefault != nil && c.oid != 0 { // a message's field has no column default
		dst = append(dst, `,"default":`...)
		dst = append(dst, r.keyDefault...)
	}
	dst = append(dst, `},"payload":`...)
	if c.null {
		return append(dst, `null}`...)
	}
	if c.oid == 0 { // a message's field: its text, as a string
		c.json = false
	}
	dst = appendJSONKey(dst, c)
	return append(dst, '}')
}

// parseTimestamp reads Postgres' text form of timestamptz/timestamp (ISO
// DateStyle), or milliseconds since the epoch for integer columns and
// message fields.
func parseTimestamp(data []byte, oid uint32) (time.Time, error) {
	s := string(data)
	if oid != oidTimestamp && oid != oidTimestamptz {
		if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.UnixMilli(ms).UTC(), nil
		}
	}
	for _, layout := range []string{
		"2006-01-02 15:04:05.999999999-07", "2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999-07:00:00",
		time.RFC3339Nano, "2006-01-02 15:04:05.999999999",
	} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a timestamp (ISO text, RFC 3339, or milliseconds since 1970)", s)
}

// topic fills the template with the route-by value.
func (r *Router) topic(routeBy []byte) (string, error) {
	if r.re != nil {
		v := string(routeBy)
		loc := r.re.FindStringSubmatchIndex(v)
		if loc == nil {
			return "", fmt.Errorf("value %q of column %s does not match router.topic_regex %q as a whole", v, r.cfg.RouteByColumn, r.cfg.TopicRegex)
		}
		// Placeholder is a reference to the group named routedByValue.
		return string(r.re.ExpandString(nil, r.cfg.TopicTemplate, v, loc)), nil
	}
	if len(r.parts) == 1 {
		return r.parts[0], nil
	}
	var b strings.Builder
	for i, p := range r.parts {
		if i > 0 {
			b.Write(routeBy)
		}
		b.WriteString(p)
	}
	return b.String(), nil
}

// checkTopic applies Kafka's rules for topic names.
func checkTopic(t string) error {
	switch {
	case t == "":
		return fmt.Errorf("empty topic name")
	case t == "." || t == "..":
		return fmt.Errorf("a topic may not be named '.' or '..'")
	case len(t) > 249:
		return fmt.Errorf("longer than Kafka's 249 characters")
	case !utf8.ValidString(t):
		return fmt.Errorf("not valid UTF-8")
	}
	for _, c := range t {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("character %q is not allowed in a Kafka topic name (letters, digits, '.', '_', '-')", c)
		}
	}
	return nil
}
