package router

import (
	"fmt"
	"strings"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/wal"
)

// Placeholder in a topic template for the route-by column's value, as in
// Debezium's route.topic.replacement.
const Placeholder = "${routedByValue}"

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is a routed outbox row.
type Record struct {
	Topic   string
	Key     []byte // nil when the key column is NULL
	Value   []byte // nil when the payload column is NULL
	Headers []Header
	EventID string
}

// RowError reports an outbox row that cannot be routed.
type RowError struct {
	EventID string
	LSN     wal.LSN
	Table   string
	Reason  string
}

func (e *RowError) Error() string {
	id := e.EventID
	if id == "" {
		id = "(unknown)"
	}
	return fmt.Sprintf("cannot route outbox row %s at LSN %s in %s: %s", id, e.LSN, e.Table, e.Reason)
}

// Router routes rows; see the package documentation.
type Router struct {
	cfg    config.Router
	parts  []string // the template split around Placeholder
	rel    *wal.Relation
	layout layout
}

type layout struct {
	id, routeBy, key, payload, eventType int // column index, -1 when absent
}

// New returns a Router for cfg.
func New(cfg config.Router) (*Router, error) {
	if cfg.TopicTemplate == "" {
		return nil, fmt.Errorf("router: empty topic template")
	}
	return &Router{cfg: cfg, parts: strings.Split(cfg.TopicTemplate, Placeholder)}, nil
}

// Columns returns the columns a table must have for r to route its rows.
func (r *Router) Columns() []string {
	cols := []string{r.cfg.IDColumn, r.cfg.RouteByColumn, r.cfg.KeyColumn, r.cfg.PayloadColumn}
	if r.cfg.EventTypeColumn != "" {
		cols = append(cols, r.cfg.EventTypeColumn)
	}
	return cols
}

func (r *Router) layoutFor(rel *wal.Relation) (layout, error) {
	if rel == r.rel {
		return r.layout, nil
	}
	l := layout{
		id: rel.Index(r.cfg.IDColumn), routeBy: rel.Index(r.cfg.RouteByColumn),
		key: rel.Index(r.cfg.KeyColumn), payload: rel.Index(r.cfg.PayloadColumn), eventType: -1,
	}
	if r.cfg.EventTypeColumn != "" {
		l.eventType = rel.Index(r.cfg.EventTypeColumn)
	}
	var missing []string
	for _, c := range []struct {
		name string
		idx  int
	}{{r.cfg.IDColumn, l.id}, {r.cfg.RouteByColumn, l.routeBy}, {r.cfg.KeyColumn, l.key}, {r.cfg.PayloadColumn, l.payload}} {
		if c.idx < 0 {
			missing = append(missing, c.name)
		}
	}
	if r.cfg.EventTypeColumn != "" && l.eventType < 0 {
		missing = append(missing, r.cfg.EventTypeColumn)
	}
	if len(missing) > 0 {
		return l, fmt.Errorf("table has no column %s; add it or set the router.*_column settings to the table's column names", strings.Join(missing, ", "))
	}
	r.rel, r.layout = rel, l
	return l, nil
}

// Route maps one inserted outbox row to a record.
func (r *Router) Route(c *wal.Change) (*Record, error) {
	rel := c.Relation
	fail := func(id, format string, args ...any) (*Record, error) {
		return nil, &RowError{EventID: id, LSN: c.LSN, Table: rel.QualifiedName(), Reason: fmt.Sprintf(format, args...)}
	}
	l, err := r.layoutFor(rel)
	if err != nil {
		return fail("", "%v", err)
	}
	value := func(i int) ([]byte, error) { return rel.Columns[i].Value(c.Tuple[i]) }

	id, err := value(l.id)
	if err != nil {
		return fail("", "%v", err)
	}
	if id == nil {
		return fail("", "column %s is NULL; every outbox row needs an event id", r.cfg.IDColumn)
	}
	eventID := string(id)
	routeBy, err := value(l.routeBy)
	if err != nil {
		return fail(eventID, "%v", err)
	}
	if routeBy == nil {
		return fail(eventID, "column %s is NULL, so there is no topic to route to", r.cfg.RouteByColumn)
	}
	topic := r.topic(routeBy)
	if err := checkTopic(topic); err != nil {
		return fail(eventID, "topic %q from column %s: %v", topic, r.cfg.RouteByColumn, err)
	}
	rec := &Record{Topic: topic, EventID: eventID}
	if rec.Key, err = value(l.key); err != nil {
		return fail(eventID, "%v", err)
	}
	if rec.Value, err = value(l.payload); err != nil {
		return fail(eventID, "%v", err)
	}
	rec.Headers = make([]Header, 0, 2)
	rec.Headers = append(rec.Headers, Header{Key: r.cfg.IDHeader, Value: id})
	if l.eventType >= 0 {
		et, err := value(l.eventType)
		if err != nil {
			return fail(eventID, "%v", err)
		}
		if et != nil {
			rec.Headers = append(rec.Headers, Header{Key: r.cfg.EventTypeHeader, Value: et})
		}
	}
	return rec, nil
}

func (r *Router) topic(routeBy []byte) string {
	if len(r.parts) == 1 {
		return r.parts[0]
	}
	var b strings.Builder
	for i, p := range r.parts {
		if i > 0 {
			b.Write(routeBy)
		}
		b.WriteString(p)
	}
	return b.String()
}

// checkTopic applies Kafka's rules for topic names.
func checkTopic(t string) error {
	switch {
	case t == "":
		return fmt.Errorf("empty topic name")
	case t == "." || t == "..":
		return fmt.Errorf("a topic may not be named . or ..")
	case len(t) > 249:
		return fmt.Errorf("longer than Kafka's 249 characters")
	}
	for _, c := range t {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("character %q is not allowed in a Kafka topic name (letters, digits, '.', '_', '-')", c)
		}
	}
	return nil
}
