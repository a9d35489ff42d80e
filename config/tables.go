package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/shard"
)

// TableEntry is one entry of postgres.tables: a schema-qualified table name
// or pattern, with the router settings that differ for its tables. In YAML
// an entry is either the name alone ("orders.outbox") or a mapping with
// name and router.
type TableEntry struct {
	// Name is schema.table; a * in either part matches any run of
	// characters (tenant_*.outbox_events, *.outbox).
	Name string `yaml:"name"`
	// Router holds router settings, written as under router:, that
	// override the top-level router section for this entry's tables.
	Router yaml.Node `yaml:"router"`
}

// UnmarshalYAML takes a bare name or a mapping of name and router, refusing
// any other key.
func (e *TableEntry) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*e = TableEntry{Name: n.Value}
		return nil
	case yaml.MappingNode:
	default:
		return fmt.Errorf("line %d: postgres.tables: an entry is a table name or a mapping with name and router", n.Line)
	}
	*e = TableEntry{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		switch key.Value {
		case "name":
			if val.Kind != yaml.ScalarNode {
				return fmt.Errorf("line %d: postgres.tables: name must be a table name such as public.outbox", val.Line)
			}
			e.Name = val.Value
		case "router":
			if val.Kind != yaml.MappingNode {
				return fmt.Errorf("line %d: postgres.tables: router must be a mapping of router settings", val.Line)
			}
			e.Router = *val
		default:
			hint := ""
			if best := closest(key.Value, []string{"name", "router"}); best != "" {
				hint = " (did you mean postgres.tables[].router?)"
				if best == "name" {
					hint = " (did you mean postgres.tables[].name?)"
				}
			}
			return fmt.Errorf("line %d: unknown setting postgres.tables[].%s%s; an entry has name and router", key.Line, key.Value, hint)
		}
	}
	return nil
}

// MarshalYAML writes the entry back: the name alone when nothing is
// overridden.
func (e TableEntry) MarshalYAML() (any, error) {
	if e.Router.Kind == 0 {
		return e.Name, nil
	}
	return struct {
		Name   string     `yaml:"name"`
		Router *yaml.Node `yaml:"router"`
	}{e.Name, &e.Router}, nil
}

// Pattern reports whether the entry's name holds a *.
func (e TableEntry) Pattern() bool { return strings.Contains(e.Name, "*") }

// Split returns the schema and table parts of the name.
func (e TableEntry) Split() (schema, table string) {
	schema, table, _ = strings.Cut(e.Name, ".")
	return schema, table
}

// Matches reports whether the table schema.table is one of the entry's:
// the same name, compared exactly as Postgres compares identifiers, or a
// match of its pattern.
func (e TableEntry) Matches(schema, table string) bool {
	ps, pt := e.Split()
	return globMatch(ps, schema) && globMatch(pt, table)
}

// EntryOf returns the index of the entry of postgres.tables whose router
// settings the table schema.table takes: the entry that names it exactly,
// else the first pattern that matches it; ok is false when none does. A
// table two patterns match takes the first one's, at start-up
// (pg.MatchTables) as when it is created while outboxd runs.
func (p Postgres) EntryOf(schema, table string) (int, bool) {
	first := -1
	for i, e := range p.Tables {
		switch {
		case !e.Matches(schema, table):
		case !e.Pattern():
			return i, true
		case first < 0:
			first = i
		}
	}
	return first, first >= 0
}

// Overlaps returns the pairs of patterns of postgres.tables that some
// table name matches both of, the earlier entry first: such a table takes
// the earlier one's settings (EntryOf), which outboxd migrate warns of.
func (p Postgres) Overlaps() [][2]int {
	var out [][2]int
	for i, a := range p.Tables {
		for j := i + 1; j < len(p.Tables); j++ {
			b := p.Tables[j]
			if !a.Pattern() || !b.Pattern() {
				continue
			}
			as, at := a.Split()
			bs, bt := b.Split()
			if globsMeet(as, bs) && globsMeet(at, bt) {
				out = append(out, [2]int{i, j})
			}
		}
	}
	return out
}

// globsMeet reports whether some string matches both patterns a and b (a
// * stands for any run of characters).
func globsMeet(a, b string) bool {
	ra, rb := []rune(a), []rune(b)
	seen := map[[2]int]bool{}
	// meet reports whether some string matches both ra[i:] and rb[j:].
	var meet func(i, j int) bool
	meet = func(i, j int) bool {
		if i == len(ra) && j == len(rb) {
			return true
		}
		if seen[[2]int{i, j}] {
			return false
		}
		seen[[2]int{i, j}] = true
		starA, starB := i < len(ra) && ra[i] == '*', j < len(rb) && rb[j] == '*'
		switch {
		case starA && meet(i+1, j), starB && meet(i, j+1): // a * that matches no more
			return true
		case i == len(ra) || j == len(rb):
			return false
		case starA && !starB: // a's * takes b's next character
			return meet(i, j+1)
		case starB && !starA:
			return meet(i+1, j)
		}
		return !starA && ra[i] == rb[j] && meet(i+1, j+1)
	}
	return meet(0, 0)
}

// globMatch reports whether s matches pattern p, in which * stands for any
// run of characters and every other character for itself.
func globMatch(p, s string) bool {
	if !strings.Contains(p, "*") {
		return p == s
	}
	parts := strings.Split(p, "*")
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(s)
}

// LikePattern returns the part of a name (schema or table) as a SQL LIKE
// pattern, with \ as the escape character: * becomes %, and %, _ and \
// are escaped.
func LikePattern(part string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`, `*`, `%`)
	return r.Replace(part)
}

// validName reports what is wrong with an entry's name, or "".
func (e TableEntry) validName() string {
	schema, table, ok := strings.Cut(e.Name, ".")
	switch {
	case !ok || schema == "" || table == "" || strings.Contains(table, "."):
		return "must be schema-qualified, like public.outbox or tenant_*.outbox"
	case strings.ContainsAny(e.Name, `"`):
		return "must be written without quotes: names are compared exactly as written"
	}
	return ""
}

var reLine = regexp.MustCompile(`\n?\s*line \d+: `)

// TableRouter returns the router settings of entry i: the top-level router
// section with the entry's overrides decoded onto it, strictly (an unknown
// key is an error). An override of router.preset takes that preset's column
// names for the columns the entry does not name.
func (c Config) TableRouter(i int) (Router, error) {
	r := c.Router
	e := c.Postgres.Tables[i]
	if e.Router.Kind == 0 {
		return r, nil
	}
	var peek struct {
		Preset string `yaml:"preset"`
	}
	_ = e.Router.Decode(&peek) // errors surface in the strict decode
	if peek.Preset != "" && peek.Preset != r.Preset {
		p := presets[peek.Preset]
		r.RouteByColumn, r.IDColumn, r.KeyColumn, r.PayloadColumn, r.EventTypeColumn = p.RouteByColumn, p.IDColumn, p.KeyColumn, p.PayloadColumn, p.EventTypeColumn
	}
	data, err := yaml.Marshal(inline(&e.Router))
	if err != nil {
		return r, fmt.Errorf("postgres.tables[%d].router: %w", i, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&r); err != nil && !errors.Is(err, io.EOF) {
		msg := explainUnknown(strings.ReplaceAll(err.Error(), "yaml: ", ""))
		// The line numbers are those of the re-encoded entry: drop them.
		msg = strings.TrimSpace(reLine.ReplaceAllString(strings.ReplaceAll(msg, "unmarshal errors:", ""), ""))
		msg = strings.ReplaceAll(msg, " router.", fmt.Sprintf(" postgres.tables[%d].router.", i))
		return r, fmt.Errorf("postgres.tables[%d] (%s, line %d): %s", i, e.Name, e.Router.Line, msg)
	}
	r.resolve()
	return r, nil
}

// PoisonFrom returns the entry of postgres.tables the table schema.table
// takes its settings from, as "postgres.tables[I] (NAME)" ("" when none
// does, as with postgres.table), and whether that entry sets
// router.poison.policy itself; otherwise the top-level one decides.
func (c Config) PoisonFrom(schema, table string) (entry string, own bool) {
	i, ok := c.Postgres.EntryOf(schema, table)
	if !ok {
		return "", false
	}
	e := c.Postgres.Tables[i]
	var peek struct {
		Poison struct {
			Policy string `yaml:"policy"`
		} `yaml:"poison"`
	}
	own = e.Router.Kind != 0 && e.Router.Decode(&peek) == nil && peek.Poison.Policy != ""
	return fmt.Sprintf("postgres.tables[%d] (%s)", i, e.Name), own
}

// inline returns a copy of n with each alias replaced by the node it
// refers to, so that the node re-encoded alone still holds what anchors
// elsewhere in the file gave it.
func inline(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return inline(n.Alias)
	}
	c := *n
	c.Anchor = ""
	c.Content = make([]*yaml.Node, len(n.Content))
	for i, k := range n.Content {
		c.Content[i] = inline(k)
	}
	return &c
}

// validateTables checks postgres.tables: each name, each entry's merged
// router settings, and that no two entries are the same name.
func (c Config) validateTables() []error {
	var errs []error
	seen := map[string]int{}
	for i, e := range c.Postgres.Tables {
		field := fmt.Sprintf("postgres.tables[%d]", i)
		if msg := e.validName(); msg != "" {
			errs = append(errs, fmt.Errorf("%s: %q %s", field, e.Name, msg))
			continue
		}
		if j, ok := seen[e.Name]; ok {
			errs = append(errs, fmt.Errorf("%s: %q is also postgres.tables[%d]; list each name once", field, e.Name, j))
		}
		seen[e.Name] = i
		r, err := c.TableRouter(i)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, err := range append(r.validate(), r.validateEnums()...) {
			errs = append(errs, fmt.Errorf("%s (%s): %w", field, e.Name, err))
		}
	}
	return errs
}

// peekTables reports whether the YAML data sets postgres.table and
// postgres.tables.
func peekTables(data []byte) (table, tables bool) {
	var doc struct {
		Postgres map[string]yaml.Node `yaml:"postgres"`
	}
	_ = yaml.Unmarshal(data, &doc) // errors surface in the strict decode
	_, table = doc.Postgres["table"]
	n, tables := doc.Postgres["tables"]
	// An empty list (tables: [], as a written-back configuration has it
	// beside table) lists nothing.
	tables = tables && !(n.Kind == yaml.SequenceNode && len(n.Content) == 0)
	return table, tables
}

// settleTables resolves postgres.table and postgres.tables after the file and
// the environment are read: both set is an error; postgres.tables set
// leaves postgres.table empty, for postgres.table is the one-table
// shorthand of postgres.tables.
func settleTables(cfg *Config, data []byte, environ []string) error {
	table, tables := peekTables(data)
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		switch name {
		case EnvPrefix + "POSTGRES_TABLE":
			table = true
		case EnvPrefix + "POSTGRES_TABLES":
			tables = tables || value != ""
		}
	}
	if !tables {
		cfg.Postgres.Tables = nil
		return nil
	}
	if table {
		return errors.New("postgres.table and postgres.tables are both set; postgres.table is the shorthand for one table: " +
			"list every table under postgres.tables and remove postgres.table (or OUTBOXD_POSTGRES_TABLE)")
	}
	cfg.Postgres.Table = ""
	if t := cfg.Postgres.Tables; len(t) == 1 && !t[0].Pattern() && t[0].validName() == "" {
		// One table by its name is postgres.table with its router.
		r, err := cfg.TableRouter(0)
		if err != nil {
			return err
		}
		cfg.Router, cfg.Postgres.Table = r, t[0].Name
	}
	return nil
}

// oneTable reports whether postgres.tables is one table by its exact name,
// which Load has made postgres.table.
func (p Postgres) oneTable() bool {
	return len(p.Tables) == 1 && !p.Tables[0].Pattern() && p.Table == p.Tables[0].Name
}

// Several reports whether postgres.tables lists more than one table, or a
// pattern, which outboxd streams on one slot with a router per table
// (PerTable): a pattern may match any number of tables, now or later.
func (p Postgres) Several() bool { return len(p.Tables) > 1 || p.Patterns() }

// Patterns reports whether an entry of postgres.tables is a pattern, whose
// tables are read from the catalogue (PerTableOf) and picked up as they
// are created (the event trigger outboxd migrate installs).
func (p Postgres) Patterns() bool {
	for _, e := range p.Tables {
		if e.Pattern() {
			return true
		}
	}
	return false
}

// PerTable returns the configuration of each outbox table, in the order of
// postgres.tables: a copy of c whose postgres.table is the table and whose
// router is the entry's merged router (TableRouter). For postgres.table, or
// postgres.tables of one name, it is c alone.
func (c Config) PerTable() ([]Config, error) {
	if !c.Postgres.Several() {
		return []Config{c}, nil
	}
	var names []string
	var entries []int
	for i, e := range c.Postgres.Tables {
		if !e.Pattern() {
			names, entries = append(names, e.Name), append(entries, i)
		}
	}
	return c.PerTableOf(names, entries)
}

// PerTableOf is PerTable for the tables names, each of the entry of
// postgres.tables at the same index of entries: the tables of patterns,
// as read from the catalogue (pg.MatchTables), and of exact names. PerTable
// alone leaves out the tables of patterns.
func (c Config) PerTableOf(names []string, entries []int) ([]Config, error) {
	out := make([]Config, len(names))
	for i, name := range names {
		r, err := c.TableRouter(entries[i])
		if err != nil {
			return nil, err
		}
		t := c
		t.Postgres.Table, t.Postgres.Tables, t.Router = name, nil, r
		out[i] = t
	}
	return out, nil
}

// ShardTables returns the outbox tables of postgres.table or of
// postgres.tables' exact names, each with its router.key_column, which the
// shard publications' row filters hash (postgres.shards above 1 takes no
// pattern: validateSeveral).
func (c Config) ShardTables() ([]shard.Table, error) {
	per, err := c.PerTable()
	if err != nil {
		return nil, err
	}
	return ShardTablesOf(per), nil
}

// ShardTablesOf returns the tables of per (PerTable's configurations),
// each with its router.key_column.
func ShardTablesOf(per []Config) []shard.Table {
	out := make([]shard.Table, len(per))
	for i, t := range per {
		schema, table := t.Postgres.TableName()
		out[i] = shard.Table{Schema: schema, Name: table, KeyColumn: t.Router.KeyColumn}
	}
	return out
}

// EntryNames are the names of postgres.tables' entries, comma-separated,
// for messages.
func (p Postgres) EntryNames() string {
	names := make([]string, len(p.Tables))
	for i, e := range p.Tables {
		names[i] = e.Name
	}
	return strings.Join(names, ", ")
}

// validateSeveral refuses what outboxd cannot do yet with postgres.tables
// of more than one table, or with a pattern, each with what to do instead.
// Refusing is the safe side: each of these would otherwise guess which
// table's settings apply, or read only some of the tables. router.poison,
// router.id_header and router.event_type_header may differ per table: each
// dead letter records the id and event type header names it was written
// with (internal/dlq), and outboxd dlq takes its topic with -topic.
func (c Config) validateSeveral() []error {
	p := c.Postgres
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if !p.Several() {
		return errs
	}
	if p.Shards > 1 && p.Patterns() {
		// Each shard's publication lists every outbox table with a row
		// filter on the table's key column; the event trigger adds a table
		// a pattern matches to a publication without one, so the new
		// table's rows would reach every shard.
		bad("postgres.shards", "%d with a pattern in postgres.tables (%s) is not supported yet: each shard's publication filters every table on its key column, "+
			"and a table created while outboxd runs would join the publications without its filter (the event trigger adds it unfiltered); "+
			"list the tables by name, or set postgres.shards: 1", p.Shards, p.EntryNames())
	}
	if c.Router.Messages.Prefix != "" && c.Router.Messages.Unowned == UnownedDeliver {
		bad("router.messages.unowned", "deliver with several postgres.tables: a logical message that names no table (no __outbox_table) has no table whose router settings apply; "+
			"set router.messages.unowned: ignore and write messages that name their table (package outbox: Config.Table), or router.messages.prefix: \"\" if no one writes messages")
	}
	for i, e := range p.Tables {
		r, err := c.TableRouter(i)
		if err != nil {
			continue // reported by validateTables
		}
		if r.Messages != c.Router.Messages {
			bad(fmt.Sprintf("postgres.tables[%d] (%s)", i, e.Name), "router.messages cannot be set per table: outboxd matches a logical message "+
				"by router.messages.prefix before it knows the message's table (named inside its content, by __outbox_table), so there is no table "+
				"whose messages settings could apply; set router.messages under the top-level router")
		}
	}
	return errs
}

// DLQTopics returns the dead-letter topics the configuration writes to: the
// router.poison.dlq_topic of each entry of postgres.tables whose policy is
// dlq (the top-level one with postgres.table), sorted, each once. An entry
// whose router does not decode is left out (Validate reports it).
func (c Config) DLQTopics() []string {
	var out []string
	add := func(r Router) {
		if r.Poison.Policy == PoisonDLQ && r.Poison.DLQTopic != "" && !slices.Contains(out, r.Poison.DLQTopic) {
			out = append(out, r.Poison.DLQTopic)
		}
	}
	if len(c.Postgres.Tables) == 0 {
		add(c.Router)
	}
	for i := range c.Postgres.Tables {
		if r, err := c.TableRouter(i); err == nil {
			add(r)
		}
	}
	slices.Sort(out)
	return out
}
