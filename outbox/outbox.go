package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/internal/quote"
)

// Event is one outbox event.
type Event struct {
	// ID is the event id; zero means a new UUIDv7.
	ID            uuid.UUID
	AggregateType string // names the topic: "<AggregateType>-events" by default
	AggregateID   string // the Kafka record key
	Type          string // the eventType header
	// Payload is the record value: JSON for a jsonb column (and in Message
	// mode), any bytes for a bytea column. nil is SQL NULL.
	Payload []byte
	// Headers go to the headers column (Columns.Headers, a json or jsonb
	// object) or, in Message mode, to the message's field of that name.
	// outboxd makes each one a record header; it refuses one named like its
	// id or event-type header (router.id_header, router.event_type_header).
	Headers map[string]string
	// Traceparent is a W3C trace context; it goes to the traceparent column
	// (or message field), or to the headers under "traceparent" when there
	// is none.
	Traceparent string
	// Partition, when set, goes to the partition column.
	Partition *int32
	// IdempotencyKey, when set, goes to the idempotency key column
	// (Columns.IdempotencyKey, added by migration 0002), whose unique index
	// rejects a second event with the same key for as long as the first
	// one's row is in the table. It therefore needs Insert mode, with rows
	// deleted later (no sooner than a duplicate may still arrive);
	// InsertDelete and Message mode refuse it, as they keep no row.
	IdempotencyKey string
}

// Columns names the outbox table's columns (in Message mode, the message's
// fields). ID, AggregateType, AggregateID and Payload are required; every
// other name may be "" when the table has no such column. No two may be the
// same.
type Columns struct {
	ID            string
	AggregateType string
	AggregateID   string
	EventType     string
	Payload       string
	// BinaryPayload says the payload column is bytea: Payload is sent as
	// raw bytes rather than as text.
	BinaryPayload bool
	Traceparent   string
	Partition     string
	Headers       string // json or jsonb
	// IdempotencyKey is the column of migration 0002: set it to
	// "idempotency_key" once that migration is applied, and only in Insert
	// mode (see Event.IdempotencyKey).
	IdempotencyKey string
	// IDHeader and EventTypeHeader are the headers outboxd sets from the id
	// and event type (router.id_header, router.event_type_header; "" means
	// "id", and "eventType" when EventType names a column). An event's
	// Headers may not use them: outboxd would stop at such a row.
	IDHeader, EventTypeHeader string
}

// DefaultColumns returns the column names of outboxd's table as
// migrations/0001_outbox.sql creates it, which are also the router's
// defaults. The idempotency key is opt-in: after migration 0002, set
// IdempotencyKey to "idempotency_key" on the result.
func DefaultColumns() Columns {
	return Columns{
		ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id",
		EventType: "event_type", Payload: "payload", IDHeader: "id", EventTypeHeader: "eventType",
	}
}

// DebeziumColumns returns the column names of Debezium's EventRouter
// defaults: id, aggregatetype, aggregateid, type, payload.
func DebeziumColumns() Columns {
	return Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", EventType: "type", Payload: "payload",
		IDHeader: "id", EventTypeHeader: "eventType"}
}

// Mode says how events reach the WAL.
type Mode int

const (
	// Insert inserts one row per event and leaves it in the table.
	Insert Mode = iota
	// InsertDelete inserts the rows and deletes them in the same
	// transaction; the WAL still carries the inserts. As no row stays, an
	// event with an IdempotencyKey is refused.
	InsertDelete
	// Message writes one transactional logical decoding message per event
	// and no row; see the package documentation for its content.
	Message
)

func (m Mode) String() string {
	switch m {
	case Insert:
		return "insert"
	case InsertDelete:
		return "insert-delete"
	case Message:
		return "message"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// Config describes the outbox a Writer writes to. The zero value is
// outboxd's default table, public.outbox, in Insert mode.
type Config struct {
	// Table is the outbox table, schema-qualified; "" is public.outbox. In
	// Message mode no row is written; a Table set here (even to
	// "public.outbox") is named in each message as the outbox it belongs
	// to (OwnerField), and only the outboxd whose postgres.table equals it
	// delivers the messages, so set it to exactly that. Left empty, the
	// messages name no owner, as before the field existed, and go to the
	// outboxd with router.messages.unowned: deliver (the default).
	Table   string
	Columns Columns // zero value: DefaultColumns()
	Mode    Mode
	// MessagePrefix is the prefix of logical messages in Message mode; it
	// must equal outboxd's router.messages.prefix, which ignores messages
	// with any other prefix. "" is DefaultMessagePrefix.
	MessagePrefix string
}

// OwnerField is the field of a logical message that names the outbox table
// the message belongs to (Config.Table, schema-qualified): only the outboxd
// whose postgres.table it names delivers it, so that two deployments on one
// database do not both deliver each other's messages. It is outboxd's
// router.OwnerField, and is not delivered itself.
const OwnerField = "__outbox_table"

// DefaultMessagePrefix is the logical message prefix used when
// Config.MessagePrefix is empty; it is also outboxd's default
// router.messages.prefix.
const DefaultMessagePrefix = "outbox"

// ErrDuplicate reports an event whose id or idempotency key is already in the
// outbox table (a unique violation, as reported by pgx and its database/sql
// driver). The caller's transaction is aborted: roll it back.
var ErrDuplicate = errors.New("an event with this id or idempotency key is already in the outbox")

// maxParams is Postgres' limit of bind parameters in one statement.
const maxParams = 65535

// Writer writes events; it is safe for concurrent use.
type Writer struct {
	cfg     Config
	table   string   // quoted
	owner   string   // a message's OwnerField: Config.Table, schema-qualified, unquoted; "" when not set
	cols    []string // quoted, in insert order
	idCol   string   // quoted
	perRow  int
	rowsMax int
}

// New returns a Writer for cfg, or an error naming the bad field.
func New(cfg Config) (*Writer, error) {
	owned := cfg.Table != "" // only an explicit Table names the messages' owner
	if !owned {
		cfg.Table = "public.outbox"
	}
	if cfg.Columns == (Columns{}) {
		cfg.Columns = DefaultColumns()
	}
	if cfg.MessagePrefix == "" {
		cfg.MessagePrefix = DefaultMessagePrefix
	}
	c := cfg.Columns
	for _, f := range []struct{ field, name string }{
		{"ID", c.ID}, {"AggregateType", c.AggregateType}, {"AggregateID", c.AggregateID}, {"Payload", c.Payload},
	} {
		if f.name == "" {
			return nil, fmt.Errorf("outbox: Columns.%s is empty; name the table's column (DefaultColumns and DebeziumColumns list the usual names)", f.field)
		}
	}
	named := map[string]string{} // column name -> field
	for _, f := range []struct{ field, name string }{
		{"ID", c.ID}, {"AggregateType", c.AggregateType}, {"AggregateID", c.AggregateID}, {"EventType", c.EventType},
		{"Payload", c.Payload}, {"Traceparent", c.Traceparent}, {"Partition", c.Partition}, {"Headers", c.Headers},
		{"IdempotencyKey", c.IdempotencyKey},
	} {
		if f.name == "" {
			continue
		}
		if other, ok := named[f.name]; ok {
			return nil, fmt.Errorf("outbox: Columns.%s and Columns.%s both name %q; each names its own column", other, f.field, f.name)
		}
		if f.name == OwnerField && cfg.Mode == Message {
			return nil, fmt.Errorf("outbox: Columns.%s names %q, the field a logical message names its outbox table in; rename it", f.field, f.name)
		}
		named[f.name] = f.field
	}
	switch cfg.Mode {
	case Insert, InsertDelete:
	case Message:
		if c.BinaryPayload {
			return nil, errors.New("outbox: Message mode embeds payloads as JSON; Columns.BinaryPayload must be false")
		}
	default:
		return nil, fmt.Errorf("outbox: unknown Mode %d", cfg.Mode)
	}
	schema, table, ok := strings.Cut(cfg.Table, ".")
	if !ok {
		schema, table = "public", cfg.Table
	}
	w := &Writer{cfg: cfg, table: pgx.Identifier{schema, table}.Sanitize(), idCol: ident(c.ID)}
	if owned {
		w.owner = schema + "." + table
	}
	for _, name := range []string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload, c.Traceparent, c.Partition, c.Headers, c.IdempotencyKey} {
		if name != "" {
			w.cols = append(w.cols, ident(name))
		}
	}
	w.perRow = len(w.cols)
	w.rowsMax = maxParams / w.perRow
	return w, nil
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// Statement is one SQL statement and its arguments.
type Statement struct {
	SQL  string
	Args []any
}

// Statements returns the statements that Write and WriteSQL run for events,
// in order, and the event ids (new UUIDv7s where ID is zero). It is what a
// caller with another Postgres client needs to run them itself.
func (w *Writer) Statements(events ...Event) ([]Statement, []uuid.UUID, error) {
	if len(events) == 0 {
		return nil, nil, nil
	}
	ids := make([]uuid.UUID, len(events))
	for i, e := range events {
		if e.AggregateType == "" {
			return nil, nil, fmt.Errorf("outbox: event %d: AggregateType is empty; it names the topic", i)
		}
		if err := w.checkHeaders(i, e.Headers); err != nil {
			return nil, nil, err
		}
		if e.IdempotencyKey != "" {
			switch w.cfg.Mode {
			case InsertDelete:
				return nil, nil, fmt.Errorf("outbox: event %d has an IdempotencyKey, which InsertDelete mode cannot enforce: "+
					"the row is deleted in the same transaction, so the unique index never sees the key again; "+
					"the key needs rows kept in the table (Insert mode, rows deleted later)", i)
			case Message:
				return nil, nil, fmt.Errorf("outbox: event %d has an IdempotencyKey, which needs a table: Message mode writes no row; "+
					"the key needs rows kept in the table (Insert mode, rows deleted later)", i)
			}
		}
		ids[i] = e.ID
		if e.ID == uuid.Nil {
			id, err := uuid.NewV7()
			if err != nil {
				return nil, nil, fmt.Errorf("outbox: generating event id: %w", err)
			}
			ids[i] = id
		}
	}
	if w.cfg.Mode == Message {
		stmts, err := w.messages(events, ids)
		return stmts, ids, err
	}
	var stmts []Statement
	for start := 0; start < len(events); start += w.rowsMax {
		end := min(start+w.rowsMax, len(events))
		s, err := w.insert(events[start:end], ids[start:end], start)
		if err != nil {
			return nil, nil, err
		}
		stmts = append(stmts, s)
	}
	if w.cfg.Mode == InsertDelete {
		for start := 0; start < len(ids); start += maxParams {
			stmts = append(stmts, w.delete(ids[start:min(start+maxParams, len(ids))]))
		}
	}
	return stmts, ids, nil
}

// checkHeaders refuses the headers outboxd sets itself, which it would
// refuse as a poison row.
func (w *Writer) checkHeaders(n int, h map[string]string) error {
	c := w.cfg.Columns
	idHeader, typeHeader := c.IDHeader, c.EventTypeHeader
	if idHeader == "" {
		idHeader = "id"
	}
	if typeHeader == "" && c.EventType != "" {
		typeHeader = "eventType"
	}
	for k := range h {
		if k == idHeader || k == typeHeader {
			return fmt.Errorf("outbox: event %d: header %q is one outboxd sets itself (from the event id or type), and outboxd would stop at the event; rename it", n, k)
		}
	}
	return nil
}

// insert builds one multi-row INSERT; first is the index of events[0] in
// the caller's list, for error messages.
func (w *Writer) insert(events []Event, ids []uuid.UUID, first int) (Statement, error) {
	c := w.cfg.Columns
	var b strings.Builder
	b.WriteString("INSERT INTO ")
	b.WriteString(w.table)
	b.WriteString(" (")
	b.WriteString(strings.Join(w.cols, ", "))
	b.WriteString(") VALUES ")
	args := make([]any, 0, len(events)*w.perRow)
	for i, e := range events {
		n := first + i
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for j := range w.perRow {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(len(args) + j + 1))
		}
		b.WriteByte(')')

		args = append(args, ids[i].String(), e.AggregateType, e.AggregateID)
		if c.EventType != "" {
			args = append(args, e.Type)
		} else if e.Type != "" {
			return Statement{}, fmt.Errorf("outbox: event %d has Type %q but Columns.EventType names no column", n, e.Type)
		}
		args = append(args, w.payloadArg(e.Payload))
		headers, err := w.headers(n, e, "column")
		if err != nil {
			return Statement{}, err
		}
		if c.Traceparent != "" {
			args = append(args, nullString(e.Traceparent))
		}
		if c.Partition != "" {
			if e.Partition != nil {
				args = append(args, *e.Partition)
			} else {
				args = append(args, nil)
			}
		} else if e.Partition != nil {
			return Statement{}, fmt.Errorf("outbox: event %d has a Partition but Columns.Partition names no column", n)
		}
		if c.Headers != "" {
			if len(headers) == 0 {
				args = append(args, nil)
			} else {
				h, err := json.Marshal(headers)
				if err != nil {
					return Statement{}, fmt.Errorf("outbox: event %d: encoding headers: %w", n, err)
				}
				args = append(args, string(h))
			}
		}
		if c.IdempotencyKey != "" {
			args = append(args, nullString(e.IdempotencyKey))
		} else if e.IdempotencyKey != "" {
			return Statement{}, fmt.Errorf("outbox: event %d has an IdempotencyKey but Columns.IdempotencyKey names no column; "+
				`apply migration 0002 and set Columns.IdempotencyKey = "idempotency_key"`, n)
		}
	}
	return Statement{SQL: b.String(), Args: args}, nil
}

// headers returns event n's headers, with its traceparent among them when
// Columns names no traceparent column, or an error when the table (noun
// "column") or the message ("field") has no place for them.
func (w *Writer) headers(n int, e Event, noun string) (map[string]string, error) {
	c := w.cfg.Columns
	h := e.Headers
	if e.Traceparent != "" && c.Traceparent == "" {
		if c.Headers == "" {
			return nil, fmt.Errorf("outbox: event %d has a Traceparent but Columns names neither a traceparent nor a headers %s "+
				"(Columns.Traceparent, Columns.Headers; outboxd reads them with router.traceparent_column, router.headers_column)", n, noun)
		}
		h = withHeader(h, "traceparent", e.Traceparent)
	}
	if len(h) > 0 && c.Headers == "" {
		return nil, fmt.Errorf("outbox: event %d has Headers but Columns.Headers names no %s (outboxd reads it with router.headers_column)", n, noun)
	}
	return h, nil
}

func (w *Writer) payloadArg(p []byte) any {
	switch {
	case p == nil:
		return nil
	case w.cfg.Columns.BinaryPayload:
		return p
	default:
		return string(p)
	}
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// withHeader returns a copy of h with k set to v; the caller's map is not
// changed.
func withHeader(h map[string]string, k, v string) map[string]string {
	out := make(map[string]string, len(h)+1)
	for hk, hv := range h {
		out[hk] = hv
	}
	out[k] = v
	return out
}

func (w *Writer) delete(ids []uuid.UUID) Statement {
	var b strings.Builder
	b.WriteString("DELETE FROM ")
	b.WriteString(w.table)
	b.WriteString(" WHERE ")
	b.WriteString(w.idCol)
	b.WriteString(" IN (")
	args := make([]any, len(ids))
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(i + 1))
		args[i] = id.String()
	}
	b.WriteByte(')')
	return Statement{SQL: b.String(), Args: args}
}

func (w *Writer) messages(events []Event, ids []uuid.UUID) ([]Statement, error) {
	var stmts []Statement
	var b strings.Builder
	var args []any
	flush := func() {
		b.WriteString(") AS m(content)")
		stmts = append(stmts, Statement{SQL: b.String(), Args: args})
		b.Reset()
		args = nil
	}
	for i, e := range events {
		content, err := w.message(e, ids[i], i)
		if err != nil {
			return nil, err
		}
		if len(args) == maxParams {
			flush()
		}
		if len(args) == 0 {
			b.WriteString("SELECT pg_logical_emit_message(true, ")
			b.WriteString(quote.Literal(w.cfg.MessagePrefix))
			b.WriteString(", content) FROM (VALUES ")
		} else {
			b.WriteString(", ")
		}
		args = append(args, string(content))
		b.WriteString("($")
		b.WriteString(strconv.Itoa(len(args)))
		b.WriteString("::text)")
	}
	flush()
	return stmts, nil
}

// message returns the content of event n's logical message: a JSON object
// whose fields are named like the columns, as outboxd's router reads them
// (see the package doc).
func (w *Writer) message(e Event, id uuid.UUID, n int) ([]byte, error) {
	c := w.cfg.Columns
	switch {
	case e.Partition != nil:
		return nil, fmt.Errorf("outbox: event %d has a Partition, which a logical message cannot carry", n)
	case e.Payload != nil && !json.Valid(e.Payload):
		return nil, fmt.Errorf("outbox: event %d: Payload is not valid JSON, which Message mode requires", n)
	case e.Type != "" && c.EventType == "":
		return nil, fmt.Errorf("outbox: event %d has Type %q but Columns.EventType names no field", n, e.Type)
	}
	type field struct {
		name  string
		value any
	}
	fields := []field{{c.ID, id.String()}, {c.AggregateType, e.AggregateType}, {c.AggregateID, e.AggregateID}}
	if c.EventType != "" {
		fields = append(fields, field{c.EventType, e.Type})
	}
	fields = append(fields, field{c.Payload, json.RawMessage(e.Payload)}) // nil is null
	headers, err := w.headers(n, e, "field")
	if err != nil {
		return nil, err
	}
	if c.Traceparent != "" && e.Traceparent != "" {
		fields = append(fields, field{c.Traceparent, e.Traceparent})
	}
	if len(headers) > 0 {
		fields = append(fields, field{c.Headers, headers})
	}
	if w.owner != "" {
		fields = append(fields, field{OwnerField, w.owner})
	}
	b := []byte{'{'}
	for i, f := range fields {
		if i > 0 {
			b = append(b, ',')
		}
		k, _ := json.Marshal(f.name) // a string always marshals
		v, err := json.Marshal(f.value)
		if err != nil {
			return nil, fmt.Errorf("outbox: event %d: encoding field %s: %w", n, f.name, err)
		}
		b = append(append(append(b, k...), ':'), v...)
	}
	return append(b, '}'), nil
}

// Write writes events in tx, in one round trip, and returns their ids. It
// neither commits nor rolls back tx.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, events ...Event) ([]uuid.UUID, error) {
	stmts, ids, err := w.Statements(events...)
	if err != nil || len(stmts) == 0 {
		return nil, err
	}
	if len(stmts) == 1 {
		if _, err := tx.Exec(ctx, stmts[0].SQL, stmts[0].Args...); err != nil {
			return nil, w.wrap(len(events), err)
		}
		return ids, nil
	}
	var batch pgx.Batch
	for _, s := range stmts {
		batch.Queue(s.SQL, s.Args...)
	}
	br := tx.SendBatch(ctx, &batch)
	for range stmts {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, w.wrap(len(events), err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, w.wrap(len(events), err)
	}
	return ids, nil
}

// WriteSQL is Write for database/sql. Each statement is one round trip, so
// InsertDelete mode takes two. It neither commits nor rolls back tx.
func (w *Writer) WriteSQL(ctx context.Context, tx *sql.Tx, events ...Event) ([]uuid.UUID, error) {
	stmts, ids, err := w.Statements(events...)
	if err != nil {
		return nil, err
	}
	for _, s := range stmts {
		if _, err := tx.ExecContext(ctx, s.SQL, s.Args...); err != nil {
			return nil, w.wrap(len(events), err)
		}
	}
	return ids, nil
}

func (w *Writer) wrap(n int, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return fmt.Errorf("writing %d outbox events to %s: %w: %w", n, w.table, ErrDuplicate, err)
	}
	return fmt.Errorf("writing %d outbox events to %s (%s mode): %w", n, w.table, w.cfg.Mode, err)
}
