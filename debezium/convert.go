package debezium

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
)

// Class names Convert recognises.
const (
	PostgresConnector = "io.debezium.connector.postgresql.PostgresConnector"
	EventRouter       = "io.debezium.transforms.outbox.EventRouter"
	// MessageDecoder turns a logical decoding message's JSON content into
	// an insert-like record, which an EventRouter after it routes.
	MessageDecoder = "io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent"
)

// Debezium's defaults for the settings Convert maps.
const (
	defaultSlot        = "debezium"
	defaultPublication = "dbz_publication"
	defaultRegex       = "(?<routedByValue>.*)"
	defaultReplacement = "outbox.event.${routedByValue}"
)

// Options are what a connector configuration does not say.
type Options struct {
	// Brokers are the Kafka bootstrap servers (host:port). A connector
	// configuration names them only in producer.override.bootstrap.servers.
	Brokers []string
}

// Warning is a setting outboxd does not honour as Debezium did, or a step
// the operator must take.
type Warning struct {
	Key     string // the connector setting, or the outboxd setting concerned
	Message string
}

func (w Warning) String() string { return w.Key + ": " + w.Message }

// Result is a converted configuration.
type Result struct {
	YAML     []byte    // an outboxd configuration file; never holds a password
	Warnings []Warning // sorted by key
}

// Convert maps a Debezium PostgreSQL connector with an Outbox EventRouter to
// an outboxd configuration. The result passes config.Config.Validate. It
// returns an error, which never quotes a password, when c is not such a
// connector, a setting is invalid, or a setting it reads is a Kafka Connect
// config provider reference (${provider:...}), which only Connect resolves.
func Convert(c Connector, opts Options) (Result, error) {
	v := &conv{cfg: c.Config, used: map[string]bool{}}
	if err := v.check(v.connector()); err != nil {
		return Result{}, err
	}
	ch, err := v.transforms()
	if err := v.check(err); err != nil {
		return Result{}, err
	}
	pg, err := v.postgres()
	if err := v.check(err); err != nil {
		return Result{}, err
	}
	rt, err := v.router("transforms."+ch.router+".", ch)
	if err := v.check(err); err != nil {
		return Result{}, err
	}
	kafka, err := v.kafka(opts)
	if err := v.check(err); err != nil {
		return Result{}, err
	}
	if err := v.check(v.snapshot(&pg, kafka)); err != nil {
		return Result{}, err
	}
	v.leftovers()

	name := c.Name
	if name == "" {
		name = "(unnamed)"
	}
	doc := document(fmt.Sprintf("outboxd configuration converted from Debezium connector %s by 'outboxd debezium convert'.\n"+
		"Each setting names the connector setting it comes from. The Postgres password is not here:\n"+
		"give it through PGPASSWORD, ~/.pgpass or OUTBOXD_POSTGRES_DSN.", name), pg, kafka, rt)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return Result{}, fmt.Errorf("writing YAML: %w", err)
	}
	_ = enc.Close()

	// The output must load and validate like any configuration file. The
	// certificate files need only exist where outboxd runs.
	cfg := config.Default()
	if err := config.Decode(buf.Bytes(), &cfg); err != nil {
		return Result{}, fmt.Errorf("the converted configuration does not load: %w", err)
	}
	cfg.Postgres.DSN = WithoutFiles(cfg.Postgres.DSN)
	if err := cfg.Validate(); err != nil {
		return Result{}, fmt.Errorf("the converted configuration is invalid; fix the connector setting behind it:\n%w", err)
	}
	sort.SliceStable(v.warnings, func(i, j int) bool { return v.warnings[i].Key < v.warnings[j].Key })
	return Result{YAML: buf.Bytes(), Warnings: v.warnings}, nil
}

// conv tracks which settings were consumed, so that every other one is
// reported.
type conv struct {
	cfg      map[string]string
	used     map[string]bool
	warnings []Warning
	refErr   error // the first setting read that is a config provider reference
	several  bool  // table.include.list gave postgres.tables: several tables or a pattern
}

// get reads a setting. A config provider reference in it is an error (see
// check), except in the secrets, which are never copied: their warnings say
// how to give them to outboxd.
func (v *conv) get(key string) (string, bool) {
	v.used[key] = true
	s, ok := v.cfg[key]
	s = strings.TrimSpace(s)
	if p, ref := providerReference(s); ref && !secrets[key] && v.refErr == nil {
		v.refErr = fmt.Errorf("%s is a Kafka Connect config provider reference (${%s:...}), which outboxd cannot resolve; "+
			"replace it with its value and convert again, or remove it, convert, and set the outboxd setting it maps to "+
			"in the file or through its OUTBOXD_* environment variable", key, p)
	}
	return s, ok && s != ""
}

// check returns the error of a config provider reference read so far, which
// explains err (a value misread as its literal text), else err.
func (v *conv) check(err error) error {
	if v.refErr != nil {
		return v.refErr
	}
	return err
}

// secrets are the settings Convert never copies.
var secrets = map[string]bool{"database.password": true, "database.sslpassword": true}

// configProvider is Kafka's ConfigTransformer.DEFAULT_PATTERN: ${provider:[path:]key}.
// ${routedByValue}, a group of route.topic.replacement, has no ':'.
var configProvider = regexp.MustCompile(`\$\{([^}]*?):(?:[^}]*?:)?[^}]*?\}`)

// providerReference reports whether s holds a Kafka Connect config provider
// reference such as ${file:/etc/secrets.properties:key} or ${env:VAR}, and
// names its provider. Kafka Connect resolved these; outboxd cannot.
func providerReference(s string) (provider string, ok bool) {
	m := configProvider.FindStringSubmatch(s)
	if m == nil {
		return "", false
	}
	return m[1], true
}

func (v *conv) or(key, def string) string {
	if s, ok := v.get(key); ok {
		return s
	}
	return def
}

func (v *conv) warn(key, format string, args ...any) {
	v.warnings = append(v.warnings, Warning{Key: key, Message: fmt.Sprintf(format, args...)})
}

func (v *conv) connector() error {
	class, ok := v.get("connector.class")
	switch {
	case !ok:
		return errors.New("no connector.class: this is not a Kafka Connect connector configuration")
	case class != PostgresConnector && class != "PostgresConnector":
		return fmt.Errorf("connector.class is %s, not %s: outboxd replaces Debezium's PostgreSQL connector only", class, PostgresConnector)
	}
	// Settings that need nothing from outboxd.
	for _, k := range []string{"name", "tasks.max", "topic.prefix", "database.server.name"} {
		v.used[k] = true
	}
	return nil
}

// chain is what the transform chain does that outboxd reproduces.
type chain struct {
	router string // the EventRouter's name
	// decoder is the name of a DecodeLogicalDecodingMessageContent before
	// the EventRouter, which made it route logical decoding messages; "".
	decoder string
}

// transforms finds the one EventRouter, and a message decoder before it,
// and reports the other transforms.
func (v *conv) transforms() (chain, error) {
	list, _ := v.get("transforms")
	var routers, others []string
	var ch chain
	listed := map[string]bool{}
	for _, name := range strings.Split(list, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		listed[name] = true
		switch t, _ := v.get("transforms." + name + ".type"); {
		case t == EventRouter:
			routers = append(routers, name)
		case t == MessageDecoder && len(routers) == 0 && ch.decoder == "":
			ch.decoder = name
			v.consumePrefix("transforms." + name + ".")
		default:
			others = append(others, name)
		}
	}
	switch {
	case len(routers) == 0:
		return ch, fmt.Errorf("no Outbox EventRouter: transforms lists no transform of type %s; outboxd replaces a connector that routes an outbox table with it", EventRouter)
	case len(routers) > 1:
		return ch, fmt.Errorf("transforms lists %d EventRouters (%s); outboxd routes one outbox table, convert one connector per table", len(routers), strings.Join(routers, ", "))
	}
	for _, name := range others {
		t, _ := v.get("transforms." + name + ".type")
		v.warn("transforms."+name, "transform %s is not applied by outboxd; if it changed the outbox records (topic, key, value, headers), outboxd's records differ", t)
		v.consumePrefix("transforms." + name + ".")
	}
	for k := range v.cfg {
		if name, _, ok := strings.Cut(strings.TrimPrefix(k, "transforms."), "."); ok && strings.HasPrefix(k, "transforms.") && !listed[name] {
			v.used[k] = true
			v.warn(k, "transform %s is not listed in transforms; Kafka Connect ignored it and so does outboxd", name)
		}
	}
	ch.router = routers[0]
	return ch, nil
}

func (v *conv) consumePrefix(prefix string) {
	for k := range v.cfg {
		if strings.HasPrefix(k, prefix) {
			v.used[k] = true
		}
	}
}

// section is one top-level YAML mapping, in order, with comments.
type section struct {
	name  string
	items []item
	foot  string // a comment after the last item
}

type item struct {
	key     string
	value   any
	comment string
}

func (s *section) add(key string, value any, comment string) {
	s.items = append(s.items, item{key, value, comment})
}

// value returns the value of key, or nil.
func (s section) value(key string) any {
	for _, it := range s.items {
		if it.key == key {
			return it.value
		}
	}
	return nil
}

func (v *conv) postgres() (section, error) {
	s := section{name: "postgres"}
	var missing []string
	req := func(key string) string {
		val, ok := v.get(key)
		if !ok {
			missing = append(missing, key)
		}
		return val
	}
	host, user, db := req("database.hostname"), req("database.user"), req("database.dbname")
	if len(missing) > 0 {
		return s, fmt.Errorf("%s not set; Debezium requires them, and outboxd needs them for postgres.dsn", strings.Join(missing, ", "))
	}
	port := v.or("database.port", "5432")
	if err := v.check(nil); err != nil {
		return s, err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return s, fmt.Errorf("database.port %q is not a port number", port)
	}
	q := url.Values{}
	for _, k := range []string{"sslmode", "sslcert", "sslkey", "sslrootcert"} {
		if val, ok := v.get("database." + k); ok {
			q.Set(k, val)
			if k != "sslmode" {
				v.warn("database."+k, "copied to postgres.dsn as %s=%s: the file must exist where outboxd runs (pgx reads it at start-up)", k, val)
			}
		}
	}
	if m := q.Get("sslmode"); m != "" {
		switch m {
		case "disable", "allow", "prefer", "require", "verify-ca", "verify-full":
		default:
			return s, fmt.Errorf("database.sslmode %q is not disable, allow, prefer, require, verify-ca or verify-full", m)
		}
	}
	dsn := url.URL{Scheme: "postgres", User: url.User(user), Host: net.JoinHostPort(host, port), Path: "/" + db, RawQuery: q.Encode()}
	s.add("dsn", dsn.String(), "database.hostname, .port, .user, .dbname, .ssl*; no password")
	if pw, ok := v.get("database.password"); ok {
		if p, ref := providerReference(pw); ref {
			v.warn("database.password", "is a Kafka Connect config provider reference (${%s:...}), which outboxd cannot resolve. "+
				"It is not copied: give outboxd the password itself through PGPASSWORD, ~/.pgpass (%s:%s:%s:%s:PASSWORD), "+
				"postgres.password_file (OUTBOXD_POSTGRES_PASSWORD_FILE: a file holding only the password, such as a mounted secret) "+
				"or OUTBOXD_POSTGRES_DSN", p, host, port, db, user)
		} else {
			v.warn("database.password", "not copied. Give outboxd the password through the environment: set PGPASSWORD "+
				"(pgx reads it, as libpq does), or add it to ~/.pgpass (%s:%s:%s:%s:PASSWORD), "+
				"or put the whole DSN, password included, in OUTBOXD_POSTGRES_DSN", host, port, db, user)
		}
	}
	if pw, ok := v.get("database.sslpassword"); ok {
		why := "not copied"
		if p, ref := providerReference(pw); ref {
			why = fmt.Sprintf("is a Kafka Connect config provider reference (${%s:...}), which outboxd cannot resolve, and is not copied", p)
		}
		v.warn("database.sslpassword", "%s; set PGSSLPASSWORD (pgx reads it), or put sslpassword=... in OUTBOXD_POSTGRES_DSN", why)
	}

	slot := v.or("slot.name", defaultSlot)
	plugin := v.or("plugin.name", "decoderbufs")
	if plugin == "pgoutput" {
		s.add("slot", slot, "slot.name: resume Debezium's slot where it confirmed")
	} else {
		v.warn("plugin.name", "is %s (Debezium's default when unset): outboxd reads only pgoutput slots, so it cannot resume Debezium's slot %q. "+
			"The configuration names a new slot \"outboxd\": before you stop Debezium, create the publication %q for the outbox table if it does not exist, "+
			"then the slot, SELECT pg_create_logical_replication_slot('outboxd', 'pgoutput'), so that no event falls between the two "+
			"(events between its creation and Debezium's stop are delivered twice); drop %q after the cut-over", plugin, slot, v.or("publication.name", defaultPublication), slot)
		slot = "outboxd"
		s.add("slot", slot, "new pgoutput slot: Debezium's used plugin.name "+plugin)
	}
	s.add("publication", v.or("publication.name", defaultPublication), "publication.name")

	tables, err := v.table()
	if err != nil {
		return s, err
	}
	table := strings.Join(tables, ", ")
	if len(tables) == 1 && !strings.Contains(tables[0], "*") {
		s.add("table", tables[0], "table.include.list")
	} else {
		v.several = true
		s.add("tables", tables, "table.include.list: one slot and publication for all of them")
		for _, t := range tables {
			if strings.Contains(t, "*") {
				v.warn("table.include.list", "the pattern %s picks up tables created while outboxd runs through an event trigger: run outboxd migrate with this configuration "+
					"as a superuser before you start outboxd (it refuses to start without the trigger)", t)
			}
		}
	}
	s.add("create_slot", false, "resume the existing slot; a new one would skip what Debezium has not confirmed")
	failover, err := v.boolean("slot.failover", false)
	if err != nil {
		return s, err
	}
	if failover {
		s.add("failover_slot", true, "slot.failover: the slot is synchronised to standbys (Postgres 17 and later)")
	}
	switch mode := v.or("publication.autocreate.mode", "all_tables"); mode {
	case "disabled", "all_tables", "filtered":
		if plugin != "pgoutput" {
			// The new slot needs the publication to exist before it.
			s.add("create_publication", false, "create it before the new slot; see the plugin.name warning")
			break
		}
		if mode == "disabled" {
			s.add("create_publication", false, "publication.autocreate.mode: disabled")
			break
		}
		s.add("create_publication", true, "publication.autocreate.mode: "+mode+"; only if missing, for the outbox table alone")
	case "no_tables":
		v.warn("publication.autocreate.mode", "is no_tables: outboxd needs the publication to include %s; run ALTER PUBLICATION ... ADD TABLE %s", table, table)
		s.add("create_publication", false, "publication.autocreate.mode: no_tables")
	default:
		return s, fmt.Errorf("publication.autocreate.mode %q is not disabled, all_tables, filtered or no_tables", mode)
	}
	if ms, ok := v.get("status.update.interval.ms"); ok {
		d, err := millis("status.update.interval.ms", ms)
		if err != nil {
			return s, err
		}
		if d < 10*time.Millisecond || d > 30*time.Second {
			v.warn("status.update.interval.ms", "%s is outside outboxd's 10ms-30s; kept at outboxd's default 1s", d)
		} else {
			s.add("status_interval", d.String(), "status.update.interval.ms")
		}
	}
	return s, nil
}

// WithoutFiles returns a URL DSN without its certificate file parameters
// (sslcert, sslkey, sslrootcert), so that it validates on a machine that
// lacks the files.
func WithoutFiles(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	q := u.Query()
	for _, k := range []string{"sslcert", "sslkey", "sslrootcert"} {
		q.Del(k)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func millis(key, s string) (time.Duration, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s %q is not a number of milliseconds", key, s)
	}
	return time.Duration(n) * time.Millisecond, nil
}

// table reads the outbox tables from table.include.list, a list of Java
// regexes matched against schema.table: each entry is a table name or,
// where the regex translates exactly, a postgres.tables pattern.
func (v *conv) table() ([]string, error) {
	key := "table.include.list"
	list, ok := v.get(key)
	if legacy, lok := v.get("table.whitelist"); !ok && lok {
		key, list, ok = "table.whitelist", legacy, true
	}
	if !ok {
		v.warn("table.include.list", "not set, so Debezium captured every table; outboxd streams one table and assumes public.outbox: set postgres.table to your outbox table")
		return []string{"public.outbox"}, nil
	}
	var tables []string
	for _, e := range strings.Split(list, ",") {
		if e = strings.TrimSpace(e); e != "" {
			tables = append(tables, e)
		}
	}
	if len(tables) == 0 {
		return nil, fmt.Errorf("%s is empty; set it to the outbox tables", key)
	}
	out := make([]string, len(tables))
	for i, e := range tables {
		t, err := globOf(e)
		if err != nil {
			return nil, fmt.Errorf("%s entry %q %v", key, e, err)
		}
		if !strings.Contains(t, ".") {
			v.warn(key, "%q has no schema; Debezium matches it against schema.table, outboxd assumes public.%s", t, t)
			t = "public." + t
		}
		out[i] = t
	}
	return out, nil
}

// globOf translates a Java regex of table.include.list into a name or a
// postgres.tables pattern that matches exactly the same tables: \. and a
// lone . are the separator or a dot of the name (as Debezium users write
// public.outbox), .* is *, and every other character stands for itself. A
// regex with anything else, or a .* that could span the schema and the
// table, is an error that says what to write instead.
func globOf(re string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(re); i++ {
		switch c := re[i]; {
		case c == '\\' && i+1 < len(re) && re[i+1] == '.':
			b.WriteByte('.')
			i++
		case c == '.' && i+1 < len(re) && re[i+1] == '*':
			b.WriteByte('*')
			i++
		case c == '.':
			b.WriteByte('.')
		case strings.IndexByte(`\[](){}*+?|^$`, c) >= 0:
			return "", fmt.Errorf("is a regular expression outboxd cannot translate into a postgres.tables pattern (only .* translates, as *, within the schema or the table part): " +
				"list the tables it matches by name under postgres.tables, or write a pattern with * such as tenant_*.outbox, which matches any run of characters, none included")
		default:
			b.WriteByte(c)
		}
	}
	g := b.String()
	if schema, table, ok := strings.Cut(g, "."); strings.Contains(g, "*") && (!ok || schema == "" || table == "" || strings.Contains(table, ".")) {
		return "", fmt.Errorf("is a regular expression whose .* can match across the schema and the table name, which a postgres.tables pattern cannot: " +
			"write the schema and the table apart, each with * where any run of characters goes, such as *.outbox or tenant_*.outbox")
	}
	return g, nil
}

// field is config.Field as written in YAML, without an empty alias.
type field struct {
	Column    string `yaml:"column"`
	Placement string `yaml:"placement"`
	Alias     string `yaml:"alias,omitempty"`
}

func (v *conv) router(p string, ch chain) (section, error) {
	s := section{name: "router"}
	v.used[p+"type"] = true
	s.add("preset", "debezium", "Debezium's column names: id, aggregatetype, aggregateid, type, payload")

	// Topic: Kafka Connect's RegexRouter with the EventRouter's defaults.
	regex, customRegex := v.get(p + "route.topic.regex")
	if !customRegex {
		regex = defaultRegex
	}
	re, err := compileJavaRegex(regex)
	if err != nil {
		return s, fmt.Errorf("%sroute.topic.regex %q %v, or convert without it and set router.topic_regex by hand", p, regex, err)
	}
	replacement := v.or(p+"route.topic.replacement", defaultReplacement)
	parts, err := parseJavaReplacement(replacement, re)
	if err != nil {
		return s, fmt.Errorf("%sroute.topic.replacement %q %v", p, replacement, err)
	}
	simple := regex == defaultRegex
	for _, part := range parts {
		simple = simple && (part.group == "" || part.group == "routedByValue")
	}
	if simple {
		var b strings.Builder
		for _, part := range parts {
			if part.group != "" {
				b.WriteString(router.Placeholder)
			} else {
				b.WriteString(part.literal)
			}
		}
		s.add("topic_template", b.String(), "route.topic.replacement")
	} else {
		s.add("topic_template", goTemplate(parts), "route.topic.replacement, in Go's $$ and ${group} syntax")
		s.add("topic_regex", re.String(), "route.topic.regex, anchored: Kafka Connect's RegexRouter requires a whole match")
		if customRegex {
			v.warn(p+"route.topic.regex", "a value that does not match: Debezium routes the event to a topic named by the value itself, outboxd stops with a poison row naming the event (or dead-letters it, router.poison.policy: dlq)")
		}
	}

	s.add("route_by_column", v.or(p+"route.by.field", "aggregatetype"), "route.by.field")
	s.add("id_column", v.or(p+"table.field.event.id", "id"), "table.field.event.id")
	s.add("key_column", v.or(p+"table.field.event.key", "aggregateid"), "table.field.event.key")
	s.add("payload_column", v.or(p+"table.field.event.payload", "payload"), "table.field.event.payload")
	s.add("event_type_column", "-", "Debezium sends the type only through table.fields.additional.placement")
	if t, ok := v.get(p + "table.field.event.type"); ok {
		v.warn(p+"table.field.event.type", "Debezium does not send column %s by itself, and neither does outboxd; place it with table.fields.additional.placement (e.g. %s:header:eventType)", t, t)
	}
	if ts, ok := v.get(p + "table.field.event.timestamp"); ok {
		s.add("timestamp_column", ts, "table.field.event.timestamp")
	}
	if tr, ok := v.get(p + "tracing.span.context.field"); ok {
		s.add("traceparent_column", tr, "tracing.span.context.field; see the warning")
		v.warn(p+"tracing.span.context.field", "mapped to router.traceparent_column, which sends the column's value as a W3C traceparent header; "+
			"Debezium's column holds a serialized OpenTelemetry span context (java.util.Properties text), not a traceparent: write a traceparent (00-<trace id>-<span id>-<flags>) into %s, or remove the setting", tr)
	}
	for _, k := range []string{"tracing.operation.name", "tracing.with.context.field.only"} {
		if _, ok := v.get(p + k); ok {
			v.warn(p+k, "outboxd creates no tracing spans; it only forwards router.traceparent_column as a header")
		}
	}
	s.add("id_header", "id", "Debezium's header for table.field.event.id")

	var fields []field
	envelope := false
	if list, ok := v.get(p + "table.fields.additional.placement"); ok {
		for _, entry := range strings.Split(list, ",") {
			if entry = strings.TrimSpace(entry); entry == "" {
				continue
			}
			f := strings.Split(entry, ":")
			if len(f) != 2 && len(f) != 3 {
				return s, fmt.Errorf("%stable.fields.additional.placement entry %q is not column:placement[:alias]", p, entry)
			}
			fl := field{Column: strings.TrimSpace(f[0]), Placement: strings.ToLower(strings.TrimSpace(f[1]))}
			if len(f) == 3 && strings.TrimSpace(f[2]) != fl.Column {
				fl.Alias = strings.TrimSpace(f[2])
			}
			switch fl.Placement {
			case "header", "envelope", "partition":
			default:
				return s, fmt.Errorf("%stable.fields.additional.placement entry %q: placement must be header, envelope or partition", p, entry)
			}
			envelope = envelope || fl.Placement == "envelope"
			fields = append(fields, fl)
		}
	}
	if len(fields) > 0 {
		s.add("additional_fields", fields, "table.fields.additional.placement")
	}
	missing := strings.ToLower(v.or(p+"table.field.additional.missing", "error"))
	if missing != "error" && missing != "ignore" {
		return s, fmt.Errorf("%stable.field.additional.missing %q is not error or ignore", p, missing)
	}
	s.add("additional_missing", missing, "table.field.additional.missing")

	keyEnc, err := v.keyEncoding()
	if err != nil {
		return s, err
	}
	s.add("key_encoding", keyEnc, "key.converter")
	expand, err := v.boolean(p+"table.expand.json.payload", false)
	if err != nil {
		return s, err
	}
	s.add("expand_json_payload", expand, "table.expand.json.payload")
	if expand {
		v.warn(p+"table.expand.json.payload", "a payload on which Debezium's task fails (a top-level JSON array, an integer beyond int64, one field holding values of different types) "+
			"stops outboxd with a poison row naming the event (or dead-letters it, router.poison.policy: dlq)")
	}
	if err := v.expandedJSON(p, expand); err != nil {
		return s, err
	}
	v.valueConverter(envelope, expand)
	tomb, err := v.boolean(p+"route.tombstone.on.empty.payload", false)
	if err != nil {
		return s, err
	}
	s.add("tombstone_on_empty_payload", tomb, "route.tombstone.on.empty.payload")
	s.add("require_key", false, "Debezium sends a NULL key column as a null key; true stops outboxd on such a row instead")

	behavior := strings.ToLower(v.or(p+"table.op.invalid.behavior", "warn"))
	switch behavior {
	case "warn":
		s.add("on_update", "warn", "table.op.invalid.behavior: warn (skip and log; outboxd logs once per run)")
	case "error":
		s.add("on_update", "warn", "table.op.invalid.behavior: error (Debezium logs at ERROR and skips)")
		v.warn(p+"table.op.invalid.behavior", "is error, which in Debezium logs the UPDATE at ERROR level and skips it; outboxd's on_update: error would stop instead, so the configuration uses warn (skip, log once per run, counted in outboxd_wal_changes_total{op=\"update\"}). Use fatal's equivalent, on_update: error, to stop")
	case "fatal":
		s.add("on_update", "error", "table.op.invalid.behavior: fatal (stop)")
	default:
		return s, fmt.Errorf("%stable.op.invalid.behavior %q is not warn, error or fatal", p, behavior)
	}

	msgs, how := v.messages(ch)
	if v.several && msgs.Prefix != "" {
		// A message has no table of its own to be routed by.
		msgs.Unowned = "ignore"
		v.warn("table.include.list", "with several outbox tables a logical message is delivered only if it names its table: add \"__outbox_table\": \"schema.table\" "+
			"to each message's JSON content (package outbox: Config.Table); router.messages.unowned: ignore passes over the others")
	}
	s.add("messages", msgs, how)
	if h, ok := v.contextHeaders(); ok {
		s.add("debezium_headers", h, "extended.headers.enabled: Debezium 3.2.1 and later wrote these headers; set enabled: true to write them too")
	}

	if f, ok := v.get(p + "table.field.event.schema.version"); ok {
		v.warn(p+"table.field.event.schema.version", "outboxd writes no Connect schemas, so column %s does not version anything; it is ignored", f)
	}
	for _, k := range []string{"predicate", "negate"} {
		if _, ok := v.get(p + k); ok {
			v.warn(p+k, "outboxd applies its router to every row of the outbox table; a predicate that skipped records has no equivalent")
		}
	}
	for k := range v.cfg {
		if strings.HasPrefix(k, p) && !v.used[k] {
			v.used[k] = true
			v.warn(k, "not an EventRouter option outboxd knows; ignored")
		}
	}
	return s, nil
}

type messages struct {
	Prefix  string `yaml:"prefix"`
	Unowned string `yaml:"unowned,omitempty"`
}

// messages maps what the connector did with logical decoding messages. An
// EventRouter routes them only after a DecodeLogicalDecodingMessageContent;
// otherwise they passed it unrouted, so outboxd's message routing is
// turned off.
func (v *conv) messages(ch chain) (messages, string) {
	include, incl := v.get("message.prefix.include.list")
	exclude, excl := v.get("message.prefix.exclude.list")
	if ch.decoder == "" {
		if incl || excl {
			v.warn("message.prefix.include.list", "the EventRouter did not route logical decoding messages (no %s before it in transforms): "+
				"Kafka Connect sent them unrouted to the topic <topic.prefix>.message; outboxd does not deliver them (router.messages.prefix is empty)", MessageDecoder)
		}
		return messages{}, "off: no DecodeLogicalDecodingMessageContent before the EventRouter, so Debezium did not route pg_logical_emit_message events"
	}
	d := "transforms." + ch.decoder
	v.warn(d, "outboxd routes transactional messages only (pg_logical_emit_message(true, ...)); Debezium also routed non-transactional ones, "+
		"which may come from transactions that rolled back. A message's JSON content holds the fields named like the columns")
	how := "transforms." + ch.decoder + " (DecodeLogicalDecodingMessageContent) made the EventRouter route pg_logical_emit_message events"
	switch {
	case incl && !strings.Contains(include, ",") && !javaRegexMeta(include) && !excl:
		return messages{Prefix: include}, how + " with the prefix in message.prefix.include.list"
	case incl || excl:
		v.warn(d, "Debezium routed the logical decoding messages whose prefix message.prefix.include.list / exclude.list (%q / %q) allow; "+
			"outboxd routes the messages of one prefix, router.messages.prefix, set to outbox: set it to the prefix your application writes", include, exclude)
	default:
		v.warn(d, "Debezium routed logical decoding messages of every prefix; outboxd routes the messages of one prefix, "+
			"router.messages.prefix, set to outbox: set it to the prefix your application writes")
	}
	return messages{Prefix: "outbox"}, how + "; see the warning"
}

// javaRegexMeta reports whether s holds a character with a meaning in a
// Java regular expression, so that it is not one literal prefix.
func javaRegexMeta(s string) bool { return strings.ContainsAny(s, `\^$.|?*+()[]{}`) }

type contextHeaders struct {
	Enabled              bool   `yaml:"enabled"`
	ConnectorLogicalName string `yaml:"connector_logical_name"`
	TaskID               string `yaml:"task_id"`
	ConnectorName        string `yaml:"connector_name"`
}

// contextHeaders warns of the four headers Debezium 3.2.1 and later adds to
// every record unless extended.headers.enabled is false, and returns the
// setting that writes them, off.
func (v *conv) contextHeaders() (contextHeaders, bool) {
	if on, _ := v.boolean("extended.headers.enabled", true); !on {
		return contextHeaders{}, false
	}
	name := v.or("topic.prefix", v.or("database.server.name", ""))
	v.warn("extended.headers.enabled", "is true (its default): Debezium 3.2.1 and later added the headers __debezium.context.connectorLogicalName (%s), "+
		"__debezium.context.taskId, __debezium.context.connectorName and __debezium.context.runId to every record. outboxd does not by default, "+
		"so consumers that read them (lineage tools, filters by connector) lose them; set router.debezium_headers.enabled: true to write them "+
		"with the values in the file (runId: a random UUID at each start, as Debezium's task chooses one)", name)
	return contextHeaders{ConnectorLogicalName: name, TaskID: "0", ConnectorName: "postgresql"}, true
}

// expandedJSON warns of what Debezium dropped from an expanded payload.
// Debezium rebuilt it as a Connect Struct with a schema inferred from the
// JSON (JsonSchemaData), in which, by default (ignore), a null value or an
// empty array has no schema, so its field is left out. outboxd sends
// Postgres' jsonb text as it is, keeping them.
func (v *conv) expandedJSON(p string, expand bool) error {
	for _, o := range []struct{ key, keep, dropped, example string }{
		{"table.json.payload.null.behavior", "optional_bytes", "fields whose value is null", `{"a":1,"b":null} became {"a":1}`},
		{"table.json.payload.empty.array.behavior", "optional_string", "fields whose value is an empty array", `{"a":1,"b":[]} became {"a":1}`},
	} {
		val, set := v.get(p + o.key)
		switch b := strings.ToLower(val); {
		case !set || b == "ignore":
			// Debezium's default, which outboxd's expansion reproduces
		case b != o.keep:
			return fmt.Errorf("%s%s %q is not ignore or %s", p, o.key, val, o.keep)
		case expand:
			v.warn(p+o.key, "is %s: Debezium kept %s in the expanded payload; outboxd's expansion drops them as Debezium's default, ignore, does (%s)", val, o.dropped, o.example)
		}
	}
	return nil
}

func (v *conv) boolean(key string, def bool) (bool, error) {
	s, ok := v.get(key)
	if !ok {
		return def, nil
	}
	switch strings.ToLower(s) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("%s %q is not true or false", key, s)
}

const (
	jsonConverter   = "org.apache.kafka.connect.json.JsonConverter"
	stringConverter = "org.apache.kafka.connect.storage.StringConverter"
)

var byteConverters = map[string]bool{
	"org.apache.kafka.connect.converters.ByteArrayConverter": true,
	"io.debezium.converters.ByteArrayConverter":              true,
	"io.debezium.converters.BinaryDataConverter":             true,
}

// keyEncoding maps key.converter: Kafka Connect hashed the serialized key
// bytes, so the encoding decides the partition.
func (v *conv) keyEncoding() (string, error) {
	conv, ok := v.get("key.converter")
	schemas, _ := v.boolean("key.converter.schemas.enable", true)
	switch {
	case !ok:
		v.warn("key.converter", "not set, so Kafka Connect used the worker's key.converter; the configuration assumes JsonConverter with schemas on "+
			"(Kafka's sample worker configurations and Debezium's container images use it): key_encoding json_schema. "+
			"If the worker used StringConverter, set router.key_encoding: string, and with JsonConverter and schemas.enable=false, json, or keys and their partitions change. "+
			"To check, read a key Debezium wrote (kafka-console-consumer --property print.key=true): one that starts with {\"schema\": is json_schema")
		return "json_schema", nil
	case conv == stringConverter:
		// Java's toString of Debezium's value: numeric(p,s) keys as
		// BigDecimal.toString, booleans true/false, dates as days.
		return "string", nil
	case byteConverters[conv]:
		return "raw", nil
	case conv == jsonConverter:
		if schemas { // JsonConverter's default: {"schema":...,"payload":...} keys
			return "json_schema", nil
		}
		return "json", nil
	default:
		v.warn("key.converter", "%s is not supported; outboxd writes the key column's bytes (key_encoding: raw) or JsonConverter's bytes (json, json_schema), so keys and their partitions change", conv)
		return "raw", nil
	}
}

// valueConverter reports value encodings outboxd cannot reproduce. outboxd's
// value is the payload column's text (bytea: raw bytes), or with envelope
// placements a JSON object like JsonConverter's without schemas.
func (v *conv) valueConverter(envelope, expand bool) {
	conv, ok := v.get("value.converter")
	schemas, _ := v.boolean("value.converter.schemas.enable", true)
	switch {
	case !ok:
		v.warn("value.converter", "not set, so Kafka Connect used the worker's value.converter; outboxd writes the payload column's text as StringConverter does (bytea: its bytes, as ByteArrayConverter does)")
	case conv == stringConverter || byteConverters[conv]:
		if envelope || expand {
			v.warn("value.converter", "%s wrote the envelope (envelope placements) or the expanded payload as a Java Struct string; outboxd writes JSON as JsonConverter (schemas off) does", conv)
		}
	case conv == jsonConverter && schemas:
		v.warn("value.converter.schemas.enable", "is true (JsonConverter's default): Debezium's values were {\"schema\":...,\"payload\":...} envelopes; outboxd writes the payload alone, so consumers must read it directly")
	case conv == jsonConverter && !envelope && !expand:
		v.warn("value.converter", "JsonConverter (schemas off) wrote the payload as a JSON string literal (quoted, escaped); outboxd writes the payload's text itself, so consumers that decode a JSON string must parse the value directly")
	case conv == jsonConverter: // envelope or expansion: outboxd writes what JsonConverter wrote
	default:
		v.warn("value.converter", "%s is not supported; outboxd writes the payload column's text (bytea: its bytes)", conv)
	}
	if hc, ok := v.get("header.converter"); ok && hc != "org.apache.kafka.connect.storage.SimpleHeaderConverter" {
		v.warn("header.converter", "%s is not supported; outboxd writes header values as text, as SimpleHeaderConverter does", hc)
	}
}

func (v *conv) kafka(opts Options) (section, error) {
	s := section{name: "kafka"}
	brokers := opts.Brokers
	from := "-brokers"
	if len(brokers) == 0 {
		if b, ok := v.get("producer.override.bootstrap.servers"); ok {
			from = "producer.override.bootstrap.servers"
			for _, h := range strings.Split(b, ",") {
				if h = strings.TrimSpace(h); h != "" {
					brokers = append(brokers, strings.TrimPrefix(strings.TrimPrefix(h, "PLAINTEXT://"), "SSL://"))
				}
			}
		}
	}
	if len(brokers) > 0 {
		s.add("brokers", brokers, from)
	} else {
		v.warn("kafka.brokers", "a connector configuration does not name the Kafka cluster (the Connect worker's bootstrap.servers does); "+
			"convert with -brokers host:port,... or set OUTBOXD_KAFKA_BROKERS; the configuration keeps the default 127.0.0.1:9092")
	}
	if id, ok := v.get("producer.override.client.id"); ok {
		s.add("client_id", id, "producer.override.client.id")
	}
	if n, ok := v.get("topic.creation.default.partitions"); ok {
		p, err := strconv.Atoi(n)
		if err != nil || (p < 1 && p != -1) {
			return s, fmt.Errorf("topic.creation.default.partitions %q is not a partition count", n)
		}
		if p == -1 {
			s.add("topic_creation", "admin", "topic.creation.default.*: the connector created topics")
			v.warn("topic.creation.default.partitions", "is -1 (the broker's num.partitions); outboxd needs a number and uses its default 6: set kafka.topic_partitions to the broker's num.partitions to keep new topics alike")
		} else {
			s.add("topic_creation", "admin", "topic.creation.default.*: the connector created topics")
			s.add("topic_partitions", p, "topic.creation.default.partitions")
		}
		if rf, ok := v.get("topic.creation.default.replication.factor"); ok {
			r, err := strconv.Atoi(rf)
			if err != nil || r == 0 || r < -1 {
				return s, fmt.Errorf("topic.creation.default.replication.factor %q is not a replication factor", rf)
			}
			s.add("topic_replication_factor", r, "topic.creation.default.replication.factor")
		}
	} else {
		s.add("topic_creation", "broker", "no topic.creation.default.*: topics were auto-created by the broker")
	}
	if c, ok := v.get("producer.override.compression.type"); ok {
		switch c {
		case "none", "gzip", "snappy", "lz4", "zstd":
			s.add("compression", c, "producer.override.compression.type")
		default:
			v.warn("producer.override.compression.type", "%q is not none, gzip, snappy, lz4 or zstd; outboxd keeps none", c)
		}
	}
	if ms, ok := v.get("producer.override.linger.ms"); ok {
		d, err := millis("producer.override.linger.ms", ms)
		if err != nil {
			return s, err
		}
		if d > time.Minute {
			v.warn("producer.override.linger.ms", "%s is above outboxd's 1m limit; outboxd keeps its default", d)
		} else {
			s.add("linger", d.String(), "producer.override.linger.ms")
		}
	}
	if n, ok := v.get("producer.override.max.request.size"); ok {
		b, err := strconv.Atoi(n)
		if err != nil || b < 1024 {
			v.warn("producer.override.max.request.size", "%q is not a size of at least 1024 bytes; outboxd keeps 1000000", n)
		} else {
			s.add("max_message_bytes", b, "producer.override.max.request.size")
		}
	}
	if eos, ok := v.get("exactly.once.support"); ok {
		switch strings.ToLower(eos) {
		case "required":
			s.add("delivery", "exactly_once", "exactly.once.support: Kafka transactions aligned to Postgres transactions; consumers read with isolation.level=read_committed")
		case "requested":
			v.warn("exactly.once.support", "is requested; outboxd keeps at_least_once: set kafka.delivery: exactly_once for exactly-once (docs/exactly-once.md)")
		}
	}
	return s, nil
}

// unsupported explains settings outboxd has no use for, by exact key or by
// prefix (ending in '.').
var unsupported = []struct{ key, why string }{
	{"snapshot.", "only snapshot.mode and snapshot.select.statement.overrides are mapped (to postgres.backfill, which reads the snapshot exported when outboxd creates its slot, without locks)"},
	{"incremental.snapshot.", "outboxd has no incremental snapshots; send rows still in the table again with outboxd replay"},
	{"signal.", "outboxd has no signalling table; send rows still in the table again with outboxd replay"},
	{"heartbeat.", "outboxd confirms an idle slot's position from keepalives, so writes to other tables do not pin WAL; a heartbeat table's writes can stop"},
	{"slot.drop.on.stop", "outboxd never drops its slot"},
	{"slot.stream.params", "outboxd sets pgoutput's parameters itself (proto_version 1, publication_names)"},
	{"slot.max.retries", "outboxd retries with backoff until it holds the slot"},
	{"slot.retry.delay.ms", "outboxd retries with backoff until it holds the slot"},
	{"lsn.flush.", "outboxd always confirms the last fully delivered transaction to the slot"},
	{"flush.lsn.source", "outboxd always confirms the last fully delivered transaction to the slot"},
	{"offset.", "outboxd keeps no offsets: the slot's confirmed position is the only checkpoint"},
	{"max.batch.size", "outboxd produces each row as it arrives; kafka.max_buffered_records bounds memory"},
	{"max.queue.size", "outboxd produces each row as it arrives; kafka.max_buffered_records bounds memory"},
	{"max.queue.size.in.bytes", "outboxd produces each row as it arrives; kafka.max_buffered_records bounds memory"},
	{"poll.interval.ms", "outboxd does not poll; rows are produced as they arrive"},
	{"skipped.operations", "outboxd delivers INSERTs only, counts DELETEs and handles UPDATEs per router.on_update"},
	{"provide.transaction.metadata", "outboxd writes no transaction topic"},
	{"errors.", "Kafka Connect's error handling; outboxd never skips a row: one it cannot route stops it (or goes to router.poison.dlq_topic)"},
	{"exactly.once.", "only exactly.once.support is mapped (required: kafka.delivery: exactly_once)"},
	{"transaction.boundary", "in exactly_once mode outboxd's Kafka transactions hold whole Postgres transactions, committed after kafka.transaction_interval"},
	{"producer.override.", "outboxd's producer is fixed: acks=all, idempotent; only bootstrap.servers, client.id, compression.type, linger.ms and max.request.size are mapped"},
	{"consumer.override.", "outboxd has no consumer"},
	{"admin.override.", "outboxd's admin client has no settings"},
	{"topic.creation.", "outboxd creates topics with a partition count and replication factor only; other topic settings come from the broker"},
	{"predicates", "predicates have no outboxd equivalent"},
	{"predicates.", "predicates have no outboxd equivalent"},
	{"database.", "not used by outboxd's Postgres connection (pgx): put libpq parameters in postgres.dsn"},
	{"schema.", "outboxd streams the one table in postgres.table"},
	{"table.", "outboxd streams the one table in postgres.table"},
	{"column.", "outboxd sends column text as it is"},
	{"key.converter.", "outboxd's keys are router.key_encoding raw, string, json or json_schema only"},
	{"value.converter.", "outboxd's values are the payload column's text (bytea: bytes)"},
	{"header.converter.", "outboxd's header values are text"},
	{"decimal.handling.mode", "outboxd sends column text as it is, and writes a numeric key as Debezium's default (precise) does"},
	{"time.precision.mode", "outboxd sends column text as it is, and writes a date key as Debezium's default (adaptive) does"},
	{"binary.handling.mode", "outboxd sends bytea payloads as raw bytes (Debezium's default, bytes)"},
	{"hstore.handling.mode", "outboxd sends column text as it is"},
	{"interval.handling.mode", "outboxd sends column text as it is"},
	{"money.fraction.digits", "outboxd sends column text as it is"},
	{"include.unknown.datatypes", "outboxd sends column text as it is"},
	{"converters", "outboxd sends column text as it is"},
	{"field.name.adjustment.mode", "outboxd does not rename fields"},
	{"schema.name.adjustment.mode", "outboxd writes no schemas"},
	{"event.processing.failure.handling.mode", "outboxd never skips a row: one it cannot route stops it (or goes to router.poison.dlq_topic)"},
	{"publish.via.partition.root", "outboxd streams the table named in postgres.table"},
	{"replica.identity.autoset.values", "outboxd reads INSERTs only and needs no replica identity"},
}

// harmless settings change nothing an EventRouter user sees.
var harmless = map[string]bool{
	"tombstones.on.delete":        true, // the EventRouter drops DELETEs and tombstones, as outboxd does
	"errors.log.enable":           true,
	"errors.log.include.messages": true,
}

// leftovers warns about every setting not consumed.
func (v *conv) leftovers() {
	keys := make([]string, 0, len(v.cfg))
	for k := range v.cfg {
		if !v.used[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if (k == "slot.drop.on.stop" || k == "provide.transaction.metadata") && strings.EqualFold(strings.TrimSpace(v.cfg[k]), "false") {
			continue
		}
		if harmless[k] {
			continue
		}
		why := "not a setting outboxd knows; ignored"
		for _, u := range unsupported {
			if k == u.key || strings.HasSuffix(u.key, ".") && strings.HasPrefix(k, u.key) {
				why = "ignored: " + u.why
				break
			}
		}
		v.warn(k, "%s", why)
	}
}

// document builds the YAML document with a comment per setting.
func document(head string, sections ...section) *yaml.Node {
	root := &yaml.Node{Kind: yaml.MappingNode, HeadComment: head}
	for _, s := range sections {
		if len(s.items) == 0 {
			continue
		}
		m := &yaml.Node{Kind: yaml.MappingNode}
		for _, it := range s.items {
			val := &yaml.Node{}
			_ = val.Encode(it.value) // strings, bools, ints and slices of them always encode
			if val.Kind == yaml.SequenceNode && len(val.Content) > 0 && val.Content[0].Kind == yaml.ScalarNode {
				val.Style = yaml.FlowStyle
			}
			key := &yaml.Node{Kind: yaml.ScalarNode, Value: it.key}
			if val.Kind == yaml.ScalarNode || val.Style == yaml.FlowStyle {
				val.LineComment = it.comment
			} else {
				key.HeadComment = it.comment
			}
			m.Content = append(m.Content, key, val)
		}
		if s.foot != "" {
			m.Content[len(m.Content)-2].FootComment = s.foot
		}
		root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: s.name}, m)
	}
	return root
}
