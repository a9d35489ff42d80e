package config_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/shard"
)

func TestTableEntryMatches(t *testing.T) {
	for _, tc := range []struct {
		name, schema, table string
		want                bool
	}{
		{"orders.outbox", "orders", "outbox", true},
		{"orders.outbox", "Orders", "outbox", false}, // compared exactly, as Postgres compares names
		{"orders.outbox", "orders", "outbox2", false},
		{"*.outbox", "wallet", "outbox", true},
		{"*.outbox", "wallet", "outbox_events", false},
		{"tenant_*.outbox_events", "tenant_42", "outbox_events", true},
		{"tenant_*.outbox_events", "tenant_", "outbox_events", true},
		{"tenant_*.outbox_events", "tenantx42", "outbox_events", false},
		{"tenant_*.outbox_*", "tenant_a", "outbox_v2", true},
		{"a.b.c*", "a", "b.c", false}, // not a valid name; nothing matches a dot in the table part by accident
		{"pub(lic).out+box", "pub(lic)", "out+box", true},
		{"pub(lic).out+box", "public", "outbox", false},
	} {
		e := config.TableEntry{Name: tc.name}
		if got := e.Matches(tc.schema, tc.table); got != tc.want && tc.name != "a.b.c*" {
			t.Errorf("%s matches %s.%s = %v, want %v", tc.name, tc.schema, tc.table, got, tc.want)
		}
	}
}

// A table takes the entry that names it exactly, else the first pattern
// that matches it (review-patterns35 M2: start-up and runtime agree).
func TestEntryOf(t *testing.T) {
	p := config.Postgres{Tables: []config.TableEntry{{Name: "tenant_*.events"}, {Name: "*.events"}, {Name: "tenant_vip.events"}, {Name: "public.outbox"}}}
	for _, tc := range []struct {
		schema, table string
		want          int // -1: none
	}{
		{"tenant_a", "events", 0},
		{"shop", "events", 1},
		{"tenant_vip", "events", 2}, // its exact name, listed after both patterns
		{"public", "outbox", 3},
		{"public", "outbox2", -1},
	} {
		i, ok := p.EntryOf(tc.schema, tc.table)
		if !ok {
			i = -1
		}
		if i != tc.want {
			t.Errorf("EntryOf(%s.%s) = %d, want %d", tc.schema, tc.table, i, tc.want)
		}
	}
}

// Overlaps finds the patterns some table name matches both of.
func TestOverlaps(t *testing.T) {
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{[]string{"tenant_*.events", "*.events"}, "[[0 1]]"},
		{[]string{"tenant_*.events", "*.outbox"}, "[]"},
		{[]string{"tenant_*.events", "shop_*.events"}, "[]"},
		{[]string{"a*.x", "*b.x"}, "[[0 1]]"}, // ab.x
		{[]string{"a*b.x", "*c.x"}, "[]"},
		{[]string{"*_a*.x", "*_b*.x", "t.x"}, "[[0 1]]"}, // x_a_b.x; an exact name is no pattern
		{[]string{"t*.e*s", "*x.*"}, "[[0 1]]"},
		{[]string{"t*.e*s", "*x.*t"}, "[]"},
		{[]string{"é*.x", "*é.x"}, "[[0 1]]"},
	} {
		var p config.Postgres
		for _, n := range tc.names {
			p.Tables = append(p.Tables, config.TableEntry{Name: n})
		}
		if got := fmt.Sprint(p.Overlaps()); got != tc.want {
			t.Errorf("Overlaps(%v) = %s, want %s", tc.names, got, tc.want)
		}
	}
}

func TestLikePattern(t *testing.T) {
	for in, want := range map[string]string{
		"outbox":     "outbox",
		"tenant_*":   `tenant\_%`,
		"a%b":        `a\%b`,
		`back\slash`: `back\\slash`,
		"*":          "%",
	} {
		if got := config.LikePattern(in); got != want {
			t.Errorf("LikePattern(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLoadTables(t *testing.T) {
	path := writeFile(t, `
postgres:
  tables:
    - name: orders.outbox
      router:
        preset: debezium
        topic_template: orders.${routedByValue}
        key_encoding: json
`)
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
	if cfg.Postgres.Table != "orders.outbox" {
		t.Errorf("postgres.table = %q, want orders.outbox: one table is the shorthand", cfg.Postgres.Table)
	}
	r := cfg.Router
	if r.Preset != "debezium" || r.KeyColumn != "aggregateid" || r.EventTypeColumn != "type" || r.TopicTemplate != "orders.${routedByValue}" || r.KeyEncoding != config.KeyEncodingJSON {
		t.Errorf("router = %+v, want the debezium preset's columns with the entry's overrides", r)
	}
	if r.IDHeader != "id" {
		t.Errorf("router.id_header = %q: a setting the entry leaves alone keeps the router section's value", r.IDHeader)
	}

	// The bare-name form and the environment form.
	cfg, err = config.Load(writeFile(t, "postgres:\n  tables: [sales.outbox]\n"), nil)
	if err != nil || cfg.Postgres.Table != "sales.outbox" || cfg.Validate() != nil {
		t.Errorf("tables: [sales.outbox]: table %q, %v, %v", cfg.Postgres.Table, err, cfg.Validate())
	}
	// A configuration written back (tables: [] beside table) loads again.
	cfg, err = config.Load(writeFile(t, "postgres:\n  table: sales.outbox\n  tables: []\n"), nil)
	if err != nil || cfg.Postgres.Table != "sales.outbox" || cfg.Validate() != nil {
		t.Errorf("table beside tables: []: table %q, %v", cfg.Postgres.Table, err)
	}
	cfg, err = config.Load("", []string{"OUTBOXD_POSTGRES_TABLES=sales.outbox"})
	if err != nil || cfg.Postgres.Table != "sales.outbox" || cfg.Validate() != nil {
		t.Errorf("OUTBOXD_POSTGRES_TABLES: table %q, %v", cfg.Postgres.Table, err)
	}
}

func TestLoadSeveralTables(t *testing.T) {
	cfg, err := config.Load(writeFile(t, "postgres:\n  tables:\n    - a.outbox\n    - name: b.events\n      router: {key_column: k, topic_template: 'b.${routedByValue}'}\n"+
		"router:\n  messages: {unowned: ignore}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	per, err := cfg.PerTable()
	if err != nil || len(per) != 2 {
		t.Fatalf("PerTable: %d, %v", len(per), err)
	}
	if per[0].Postgres.Table != "a.outbox" || per[0].Router.KeyColumn != cfg.Router.KeyColumn {
		t.Errorf("table 0: %q, key column %q", per[0].Postgres.Table, per[0].Router.KeyColumn)
	}
	if per[1].Postgres.Table != "b.events" || per[1].Router.KeyColumn != "k" || per[1].Router.TopicTemplate != "b.${routedByValue}" || len(per[1].Postgres.Tables) != 0 {
		t.Errorf("table 1: %q, key column %q, template %q", per[1].Postgres.Table, per[1].Router.KeyColumn, per[1].Router.TopicTemplate)
	}
}

// A pattern is valid; it counts as several tables, and PerTable leaves its
// tables (read from the catalogue) out: PerTableOf gives each the entry's
// router.
func TestPatternTables(t *testing.T) {
	cfg, err := config.Load(writeFile(t, "postgres:\n  tables:\n    - a.outbox\n    - name: t_*.events\n      router: {key_column: k}\n"+
		"router:\n  messages: {unowned: ignore}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if !cfg.Postgres.Several() || !cfg.Postgres.Patterns() || cfg.Postgres.Table != "" {
		t.Fatalf("Several %v, Patterns %v, table %q", cfg.Postgres.Several(), cfg.Postgres.Patterns(), cfg.Postgres.Table)
	}
	per, err := cfg.PerTable()
	if err != nil || len(per) != 1 || per[0].Postgres.Table != "a.outbox" {
		t.Fatalf("PerTable: %v, %v", per, err)
	}
	per, err = cfg.PerTableOf([]string{"a.outbox", "t_1.events"}, []int{0, 1})
	if err != nil || len(per) != 2 {
		t.Fatalf("PerTableOf: %d, %v", len(per), err)
	}
	if per[1].Postgres.Table != "t_1.events" || per[1].Router.KeyColumn != "k" || per[0].Router.KeyColumn == "k" {
		t.Errorf("PerTableOf: %q key %q, %q key %q", per[0].Postgres.Table, per[0].Router.KeyColumn, per[1].Postgres.Table, per[1].Router.KeyColumn)
	}
}

// TestShardTables: several tables by name take postgres.shards, each keyed
// by its own key column (issue 35 §1).
func TestShardTables(t *testing.T) {
	yaml := "postgres:\n  shards: 2\n  tables: [a.outbox, {name: b.events, router: {key_column: tenant_key}}]\nrouter:\n  messages: {unowned: ignore}\n"
	cfg, err := config.Load(writeFile(t, yaml), nil)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		t.Fatal(err)
	}
	got, err := cfg.ShardTables()
	want := []shard.Table{{Schema: "a", Name: "outbox", KeyColumn: "aggregate_id"}, {Schema: "b", Name: "events", KeyColumn: "tenant_key"}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("ShardTables = %v, %v; want %v", got, err, want)
	}
}

func TestLoadTablesErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		env        []string
		want       string // in the error of Load, else of Validate
	}{
		{"both in the file", "postgres:\n  table: a.outbox\n  tables: [b.outbox]\n", nil, "postgres.table and postgres.tables are both set"},
		{"both across file and environment", "postgres:\n  tables: [b.outbox]\n", []string{"OUTBOXD_POSTGRES_TABLE=a.outbox"}, "postgres.table and postgres.tables are both set"},
		{"unknown entry key", "postgres:\n  tables:\n    - nam: a.outbox\n", nil, "unknown setting postgres.tables[].nam (did you mean postgres.tables[].name?)"},
		{"unknown router key", "postgres:\n  tables:\n    - name: a.outbox\n      router:\n        key_colum: k\n", nil, "unknown setting postgres.tables[0].router.key_colum (did you mean postgres.tables[0].router.key_column?)"},
		{"bad override", "postgres:\n  tables:\n    - name: a.outbox\n      router:\n        key_encoding: base64\n", nil, "key_encoding"},
		{"unqualified", "postgres:\n  tables: [outbox]\n", nil, `postgres.tables[0]: "outbox" must be schema-qualified`},
		{"anchors", "postgres:\n  tables:\n    - name: a.outbox\n      router: &r {key_column: k}\n    - name: b.outbox\n      router: {<<: *r, key_encoding: base64}\n", nil, "postgres.tables[1] (b.outbox): router.key_encoding"},
		{"twice", "postgres:\n  tables: [a.outbox, a.outbox]\n", nil, `postgres.tables[1]: "a.outbox" is also postgres.tables[0]`},
		{"one pattern counts as several", "postgres:\n  tables: ['*.outbox']\n", nil, "router.messages.unowned: deliver with several postgres.tables"},
		{"pattern, shards", "postgres:\n  tables: ['t_*.outbox']\n  shards: 2\nrouter:\n  messages: {unowned: ignore}\n", nil, "postgres.shards: 2 with a pattern in postgres.tables (t_*.outbox) is not supported yet"},
		{"several, unowned messages", "postgres:\n  tables: [a.outbox, b.outbox]\n", nil, "router.messages.unowned: deliver with several postgres.tables"},
		{"several, messages override", "postgres:\n  tables: [a.outbox, {name: b.outbox, router: {messages: {prefix: x}}}]\nrouter:\n  messages: {unowned: ignore}\n", nil, "postgres.tables[1] (b.outbox): router.messages cannot be set per table: outboxd matches a logical message by router.messages.prefix before it knows the message's table"},
		{"several, pattern messages override", "postgres:\n  tables: [a.outbox, {name: 't_*.outbox', router: {messages: {default_route_by: x}}}]\nrouter:\n  messages: {unowned: ignore}\n", nil, "postgres.tables[1] (t_*.outbox): router.messages cannot be set per table"},
		// A table's id or event type header is not another header of the same record.
		{"several, id_header is an inherited additional header", "postgres:\n  tables: [a.outbox, {name: b.outbox, router: {id_header: eventId}}]\nrouter:\n  messages: {unowned: ignore}\n" +
			"  additional_fields: [{column: business_id, placement: header, alias: eventId}]\n", nil,
			`postgres.tables[1] (b.outbox): router.id_header: "eventId" is also the header of router.additional_fields[0] (column business_id, placement header): each record would carry two "eventId" headers`},
		{"event_type_header is an additional header by its column name", "postgres:\n  tables: [{name: b.outbox, router: {event_type_header: kind, additional_fields: [{column: kind, placement: header}]}}]\n", nil,
			`router.event_type_header: "kind" is also the header of router.additional_fields[0] (column kind, placement header)`},
		{"event_type_header is id_header", "postgres:\n  tables: [a.outbox, {name: b.outbox, router: {event_type_header: id}}]\nrouter:\n  messages: {unowned: ignore}\n", nil,
			`postgres.tables[1] (b.outbox): router.event_type_header: "id" is also the header of router.id_header`},
		{"id_header is traceparent", "postgres:\n  table: a.outbox\nrouter:\n  id_header: traceparent\n  traceparent_column: tp\n", nil,
			`router.id_header: "traceparent" is also the header of router.traceparent_column`},
		{"several, per-table dlq without its topic", "postgres:\n  tables: [a.outbox, {name: b.outbox, router: {poison: {policy: dlq}}}]\nrouter:\n  messages: {unowned: ignore}\n", nil, "postgres.tables[1] (b.outbox): router.poison.dlq_topic: must name a topic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Load(writeFile(t, tc.yaml), tc.env)
			if err == nil {
				err = cfg.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// Issue 35 §1 "Settings": router.poison, router.id_header and
// router.event_type_header may differ per table (each dead letter records
// the header names it was written with), and DLQTopics lists every
// dead-letter topic the tables write to, for outboxd dlq.
func TestSeveralTablesPoisonAndHeadersPerTable(t *testing.T) {
	cfg, err := config.Load(writeFile(t, `
postgres:
  tables:
    - a.outbox
    - name: b.outbox
      router: {id_header: eventId, event_type_header: kind, poison: {policy: dlq, dlq_topic: b-dlq}}
    - name: c.outbox
      router: {poison: {dlq_topic: c-dlq}}
    - name: t_*.outbox
      router: {poison: {dlq_topic: b-dlq}}
router:
  messages: {unowned: ignore}
  poison: {policy: dlq, dlq_topic: dlq}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	per, err := cfg.PerTableOf([]string{"a.outbox", "b.outbox", "c.outbox", "t_1.outbox"}, []int{0, 1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct{ id, typ, topic string }{
		{"id", "eventType", "dlq"}, {"eventId", "kind", "b-dlq"}, {"id", "eventType", "c-dlq"}, {"id", "eventType", "b-dlq"},
	} {
		r := per[i].Router
		if r.IDHeader != want.id || r.EventTypeHeader != want.typ || r.Poison.Policy != config.PoisonDLQ || r.Poison.DLQTopic != want.topic {
			t.Errorf("%s: id_header %q, event_type_header %q, poison %+v; want %q, %q, dlq to %q",
				per[i].Postgres.Table, r.IDHeader, r.EventTypeHeader, r.Poison, want.id, want.typ, want.topic)
		}
	}
	if got := fmt.Sprint(cfg.DLQTopics()); got != "[b-dlq c-dlq dlq]" {
		t.Errorf("DLQTopics() = %s, want [b-dlq c-dlq dlq]", got)
	}
	// PoisonFrom: the entry whose own policy decides, for the halt error.
	for _, tc := range []struct {
		schema, table, entry string
		own                  bool
	}{
		{"b", "outbox", "postgres.tables[1] (b.outbox)", true},
		{"c", "outbox", "postgres.tables[2] (c.outbox)", false}, // only its dlq_topic
		{"a", "outbox", "postgres.tables[0] (a.outbox)", false},
		{"t_1", "outbox", "postgres.tables[3] (t_*.outbox)", false},
		{"x", "outbox", "", false},
	} {
		if entry, own := cfg.PoisonFrom(tc.schema, tc.table); entry != tc.entry || own != tc.own {
			t.Errorf("PoisonFrom(%s.%s) = %q, %v; want %q, %v", tc.schema, tc.table, entry, own, tc.entry, tc.own)
		}
	}

	// A table that halts writes no dead letters; one table alone is the
	// top-level router.
	cfg, err = config.Load(writeFile(t, "postgres:\n  tables: [a.outbox, {name: b.outbox, router: {poison: {policy: dlq, dlq_topic: b-dlq}}}]\n"+
		"router:\n  messages: {unowned: ignore}\n"), nil)
	if err != nil || cfg.Validate() != nil {
		t.Fatalf("Load: %v, Validate: %v", err, cfg.Validate())
	}
	if got := fmt.Sprint(cfg.DLQTopics()); got != "[b-dlq]" {
		t.Errorf("DLQTopics() = %s, want [b-dlq]: a.outbox halts", got)
	}
	cfg, err = config.Load(writeFile(t, "postgres:\n  tables: [{name: b.outbox, router: {poison: {policy: dlq, dlq_topic: b-dlq}}}]\n"), nil)
	if err != nil || cfg.Validate() != nil {
		t.Fatalf("Load: %v, Validate: %v", err, cfg.Validate())
	}
	if got := fmt.Sprint(cfg.DLQTopics()); got != "[b-dlq]" {
		t.Errorf("DLQTopics() of one table = %s, want [b-dlq]", got)
	}
}
