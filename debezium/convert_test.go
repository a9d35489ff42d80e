package debezium

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/golden"
)

// secret is the password every testdata input carries; no output may hold it.
const secret = "pw-SECRET-do-not-leak"

// TestConvertGolden converts each connector configuration in testdata and
// compares stdout, the warnings (or the error) with testdata/NAME.golden.
func TestConvertGolden(t *testing.T) {
	for _, tc := range []struct {
		file    string
		brokers string
	}{
		{"wrapped.json", ""}, // no brokers: warned
		{"bare.json", "kafka-1:9092,kafka-2:9092"},
		{"exactly-once.json", "kafka:9092"}, // exactly.once.support=required
		{"connector.properties", "kafka:9092"},
		{"router-options.json", ""}, // from producer.override.bootstrap.servers
		{"op-error.json", "kafka:9092"},
		{"warnings.json", "kafka:9092"},
		{"messages-routed.json", "kafka:9092"},       // a message decoder before the EventRouter, one prefix; extended headers off
		{"messages-every-prefix.json", "kafka:9092"}, // a message decoder, no prefix list
		{"messages-unrouted.json", "kafka:9092"},     // the decoder after the EventRouter: messages passed unrouted
		{"err-not-postgres.json", ""},
		{"err-no-eventrouter.json", ""},
		{"err-bad-json.json", ""},
		{"err-bad-json-value.json", ""},
		{"err-missing-host.json", ""},
		{"err-lookahead.json", ""},
		{"several-tables.properties", "kafka:9092"}, // several tables and a regex: postgres.tables with a pattern
		{"err-table-regex.properties", ""},
		{"err-bad-group.json", ""},
		{"snapshot-override.properties", "kafka:9092"}, // snapshot.mode when_needed, an override, exactly-once
		{"err-initial-only.properties", ""},
	} {
		t.Run(tc.file, func(t *testing.T) {
			in := filepath.Join("testdata", tc.file)
			args := []string{"convert"}
			if tc.brokers != "" {
				args = append(args, "-brokers", tc.brokers)
			}
			var stdout, stderr bytes.Buffer
			err := Command(append(args, in), nil, &stdout, &stderr)
			var got bytes.Buffer
			if err != nil {
				got.WriteString("-- error --\n" + err.Error() + "\n")
			} else {
				got.WriteString("-- stdout --\n" + stdout.String() + "-- stderr --\n" + stderr.String())
			}
			noSecret(t, got.String())
			golden.Check(t, strings.TrimSuffix(in, filepath.Ext(in))+".golden", got.String())
			if strings.HasPrefix(tc.file, "err-") != (err != nil) {
				t.Errorf("error = %v; inputs named err-* must fail, the others must convert", err)
			}
			if err == nil {
				loadBack(t, stdout.Bytes())
			}
		})
	}
}

func noSecret(t *testing.T, s string) {
	t.Helper()
	if strings.Contains(s, secret) || strings.Contains(s, "SECRET") {
		t.Errorf("the password appears in the output:\n%s", s)
	}
}

// loadBack loads the YAML like outboxd does and validates it.
func loadBack(t *testing.T, yamlText []byte) config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "outboxd.yaml")
	if err := os.WriteFile(path, yamlText, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatalf("config.Load: %v", err)
	}
	v := cfg
	v.Postgres.DSN = WithoutFiles(v.Postgres.DSN) // certificate files exist only where outboxd runs
	if err := v.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	return cfg
}

// TestConvertedSemantics checks the loaded configuration field by field for
// the cases where a golden diff is easy to misread.
func TestConvertedSemantics(t *testing.T) {
	conv := func(file string, brokers ...string) config.Config {
		t.Helper()
		data, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		c, err := Parse(data, Auto)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Convert(c, Options{Brokers: brokers})
		if err != nil {
			t.Fatal(err)
		}
		return loadBack(t, res.YAML)
	}
	t.Run("wrapped", func(t *testing.T) {
		cfg := conv("wrapped.json", "k:9092")
		r := cfg.Router
		for _, c := range []struct{ name, got, want string }{
			{"dsn", cfg.Postgres.DSN, "postgres://debezium@db.example.com:5432/orders?sslmode=require"},
			{"slot", cfg.Postgres.Slot, "orders_outbox"},
			{"publication", cfg.Postgres.Publication, "orders_pub"},
			{"table", cfg.Postgres.Table, "public.outboxevent"},
			{"preset", r.Preset, "debezium"},
			{"template", r.TopicTemplate, "${routedByValue}-events"},
			{"regex", r.TopicRegex, ""},
			{"event type column", r.EventTypeColumn, "-"},
			{"key encoding", string(r.KeyEncoding), "json"},
			{"on update", string(r.OnUpdate), "warn"},
			{"brokers", strings.Join(cfg.Kafka.Brokers, ","), "k:9092"},
		} {
			if c.got != c.want {
				t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
			}
		}
		if cfg.Postgres.CreateSlot {
			t.Error("create_slot is true; a migration must resume Debezium's slot, never create one")
		}
		if len(r.AdditionalFields) != 1 || r.AdditionalFields[0] != (config.Field{Column: "type", Placement: "header", Alias: "eventType"}) {
			t.Errorf("additional fields = %+v", r.AdditionalFields)
		}
	})
	t.Run("router options", func(t *testing.T) {
		r := conv("router-options.json").Router
		want := []config.Field{
			{Column: "event_type", Placement: "header", Alias: "eventType"},
			{Column: "event_type", Placement: "envelope", Alias: "type"},
			{Column: "shard", Placement: "partition"},
			{Column: "version", Placement: "header"},
		}
		if len(r.AdditionalFields) != len(want) {
			t.Fatalf("additional fields = %+v", r.AdditionalFields)
		}
		for i := range want {
			if r.AdditionalFields[i] != want[i] {
				t.Errorf("additional field %d = %+v, want %+v", i, r.AdditionalFields[i], want[i])
			}
		}
		if r.IDColumn != "event_id" || r.KeyColumn != "aggregate_id" || r.PayloadColumn != "body" || r.RouteByColumn != "aggregate_type" ||
			r.TimestampColumn != "created_at" || r.TraceparentColumn != "tracingspancontext" || r.AdditionalMissing != "ignore" ||
			r.OnUpdate != "error" || !r.TombstoneOnEmptyPayload || !r.ExpandJSONPayload {
			t.Errorf("router = %+v", r)
		}
		// Java: "events.${prefix}.$2\$x" on "orders_eu" gives "events.orders.eu$x".
		re := regexp.MustCompile(r.TopicRegex)
		v := "orders_eu"
		got := string(re.ExpandString(nil, r.TopicTemplate, v, re.FindStringSubmatchIndex(v)))
		if got != "events.orders.eu$x" {
			t.Errorf("topic for %q = %q, want Java's events.orders.eu$x", v, got)
		}
		if re.MatchString("orders") {
			t.Errorf("regex %s matches a value Java's Matcher.matches() rejects", r.TopicRegex)
		}
	})
	t.Run("properties", func(t *testing.T) {
		cfg := conv("connector.properties", "k:9092")
		if cfg.Postgres.DSN != "postgres://debezium@pg.internal:5432/inventory?sslmode=verify-full&sslrootcert=%2Fetc%2Fssl%2Fpg-root.crt" {
			t.Errorf("dsn = %s", cfg.Postgres.DSN)
		}
		if cfg.Router.TopicTemplate != "outbox.event.${routedByValue}" || cfg.Kafka.TopicPartitions != 12 ||
			cfg.Kafka.TopicReplicationFactor != 3 || cfg.Kafka.TopicCreation != "admin" || cfg.Postgres.StatusInterval.String() != "5s" {
			t.Errorf("config = %+v", cfg)
		}
	})
}

func TestJavaReplacement(t *testing.T) {
	for _, tc := range []struct {
		regex, replacement, value, want, err string
	}{
		{regex: defaultRegex, replacement: "outbox.event.${routedByValue}", value: "order", want: "outbox.event.order"},
		{regex: defaultRegex, replacement: "$1-events", value: "order", want: "order-events"},
		{regex: defaultRegex, replacement: "$0-x", value: "order", want: "order-x"},
		{regex: defaultRegex, replacement: "$10", value: "order", want: "order0"}, // Java: group 1, then '0'
		{regex: `(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)`, replacement: "$10.$1x", value: "abcdefghij", want: "j.ax"},
		{regex: defaultRegex, replacement: `a\$b\\c.${routedByValue}`, value: "v", want: `a$b\c.v`},
		{regex: defaultRegex, replacement: "${nope}", err: "does not define"},
		{regex: defaultRegex, replacement: "$2", err: "the regex has 1"},
		{regex: defaultRegex, replacement: "x$", err: "lone '$'"},
		{regex: defaultRegex, replacement: `x\`, err: `lone '\'`},
		{regex: defaultRegex, replacement: "$x", err: "illegal group reference"},
		{regex: "(?<=a)b", err: "lookbehind"},
		{regex: `(a)\1`, err: "backreferences"},
		{regex: "a++", err: "possessive"},
	} {
		t.Run(tc.regex+" "+tc.replacement, func(t *testing.T) {
			re, err := compileJavaRegex(tc.regex)
			var parts []replacementPart
			if err == nil {
				parts, err = parseJavaReplacement(tc.replacement, re)
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := string(re.ExpandString(nil, goTemplate(parts), tc.value, re.FindStringSubmatchIndex(tc.value)))
			if got != tc.want {
				t.Errorf("got %q, want %q (template %q)", got, tc.want, goTemplate(parts))
			}
		})
	}
}

func TestParseProperties(t *testing.T) {
	for _, tc := range []struct{ in, key, want string }{
		{"a=b", "a", "b"},
		{"a = b ", "a", "b "},
		{"a:b", "a", "b"},
		{"a b", "a", "b"},
		{"  a=b\\\n   c", "a", "bc"},
		{"a\\=b=c", "a=b", "c"},
		{"a=\\u0041\\t", "a", "A\t"},
		{"a=x\\\\", "a", `x\`},
		{"# a=b\n! a=c\na=d", "a", "d"},
		{"a=b\r\nc=d", "a", "b"},
		{"a", "a", ""},
		{`a=\ud83d\ude00`, "a", "\U0001F600"}, // a UTF-16 surrogate pair is one code point
		{`a=x\uD83D\uDE00y`, "a", "x\U0001F600y"},
		{`a=\ud83d`, "a", "\uFFFD"}, // a lone surrogate
		{`a=\ude00\ud83d`, "a", "\uFFFD\uFFFD"},
		{`a=\ud83d\u0041`, "a", "\uFFFDA"},
		{`a=\ud83dA`, "a", "\uFFFDA"},
	} {
		got, err := parseProperties([]byte(tc.in))
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if v, ok := got[tc.key]; !ok || v != tc.want {
			t.Errorf("%q: %s = %q (present %v), want %q; all: %q", tc.in, tc.key, v, ok, tc.want, got)
		}
	}
	if _, err := parseProperties([]byte("database.password=" + secret + "\\u12")); err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("bad escape: err = %v; want an error without the value", err)
	}
}

// TestNoPasswordLeak runs the command on every input with the password, to
// a file and to stdout, and on broken inputs, and searches everything it
// wrote.
func TestNoPasswordLeak(t *testing.T) {
	inputs, err := filepath.Glob("testdata/*.*")
	if err != nil {
		t.Fatal(err)
	}
	broken := map[string]string{
		"truncated.json":       `{"config": {"database.password": "` + secret,
		"array.json":           `["database.password", "` + secret + `"]`,
		"typed.json":           `{"database.password": {"value": "` + secret + `"}}`,
		"escape.properties":    "database.password=" + secret + "\\uZZZZ",
		"provider.properties":  "connector.class=" + PostgresConnector + "\ndatabase.hostname=${file:/s:" + secret + "}\ndatabase.user=u\ndatabase.dbname=d\ntransforms=o\ntransforms.o.type=" + EventRouter,
		"placement.properties": "connector.class=" + PostgresConnector + "\ndatabase.hostname=h\ndatabase.user=u\ndatabase.dbname=d\ndatabase.password=" + secret + "\ntransforms=o\ntransforms.o.type=" + EventRouter + "\ntransforms.o.table.fields.additional.placement=a:b:c:d",
	}
	dir := t.TempDir()
	for name, text := range broken {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, p)
	}
	for _, in := range inputs {
		if strings.HasSuffix(in, ".golden") {
			continue
		}
		for _, toFile := range []bool{false, true} {
			var stdout, stderr bytes.Buffer
			args := []string{"convert", "-brokers", "k:9092"}
			out := filepath.Join(dir, "out.yaml")
			_ = os.Remove(out)
			if toFile {
				args = append(args, "-o", out)
			}
			err := Command(append(args, in), nil, &stdout, &stderr)
			all := stdout.String() + stderr.String()
			if err != nil {
				all += err.Error()
			}
			if b, rerr := os.ReadFile(out); rerr == nil {
				all += string(b)
			}
			if strings.Contains(all, secret) {
				t.Errorf("%s (to file %v): the password leaked:\n%s", in, toFile, all)
			}
			if strings.Contains(all, "SECRET") {
				t.Errorf("%s: part of the password leaked:\n%s", in, all)
			}
		}
	}
}

func TestCommandUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"nope"}, {"convert"}, {"convert", "a", "b"}, {"convert", "-x", "a"}} {
		var stdout, stderr bytes.Buffer
		if err := Command(args, nil, &stdout, &stderr); err == nil {
			t.Errorf("%q: no error", args)
		}
		if !strings.Contains(stderr.String(), "Usage:") {
			t.Errorf("%q: no usage on stderr", args)
		}
	}
	var stdout, stderr bytes.Buffer
	in := strings.NewReader(`{"connector.class": "` + PostgresConnector + `", "database.hostname": "h", "database.user": "u", "database.dbname": "d", "transforms": "o", "transforms.o.type": "` + EventRouter + `"}`)
	if err := Command([]string{"convert", "-brokers", "k:9092", "-"}, in, &stdout, &stderr); err != nil {
		t.Fatalf("stdin: %v", err)
	}
	loadBack(t, stdout.Bytes())

	// Flags after the file, as users type them.
	stdout.Reset()
	in.Reset(`{"connector.class": "` + PostgresConnector + `", "database.hostname": "h", "database.user": "u", "database.dbname": "d", "transforms": "o", "transforms.o.type": "` + EventRouter + `"}`)
	if err := Command([]string{"convert", "-", "-brokers", "k:9092"}, in, &stdout, &stderr); err != nil {
		t.Fatalf("flags after the file: %v", err)
	}
	if !strings.Contains(stdout.String(), "k:9092") {
		t.Errorf("flags after the file: -brokers not applied:\n%s", stdout.String())
	}
}

func FuzzConvert(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.*")
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil && !strings.HasSuffix(p, ".golden") {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, Auto)
		if err != nil {
			return
		}
		res, err := Convert(c, Options{Brokers: []string{"k:9092"}})
		if err != nil {
			return
		}
		cfg := config.Default()
		if err := config.Decode(res.YAML, &cfg); err != nil {
			t.Fatalf("output does not decode: %v\n%s", err, res.YAML)
		}
		cfg.Postgres.DSN = WithoutFiles(cfg.Postgres.DSN)
		if err := cfg.Validate(); err != nil {
			t.Fatalf("output does not validate: %v", err)
		}
		if pw := c.Config["database.password"]; len(pw) >= 8 && bytes.Contains(res.YAML, []byte(pw)) {
			t.Fatalf("password in output")
		}
	})
}

// TestTableIncludeList checks the translation of table.include.list's
// regexes into postgres.tables names and patterns, and that what cannot be
// translated exactly is an error saying what to write.
func TestTableIncludeList(t *testing.T) {
	for _, tc := range []struct {
		list string
		want []string // "": an error
		err  string
	}{
		{list: "public.outbox", want: []string{"public.outbox"}},
		{list: `public\.outbox`, want: []string{"public.outbox"}},
		{list: "orders.outbox, wallet.outbox", want: []string{"orders.outbox", "wallet.outbox"}},
		{list: `tenant_.*\.outbox`, want: []string{"tenant_*.outbox"}},
		{list: `.*\.outbox,public.outbox_.*`, want: []string{"*.outbox", "public.outbox_*"}},
		{list: `tenant_.+\.outbox`, err: "cannot translate into a postgres.tables pattern (only .* translates"},
		{list: `tenant_[a-z]*\.outbox`, err: "list the tables it matches by name under postgres.tables, or write a pattern with *"},
		{list: `(a|b)\.outbox`, err: "cannot translate"},
		{list: `.*outbox`, err: "can match across the schema and the table name"},
	} {
		t.Run(tc.list, func(t *testing.T) {
			res, err := Convert(connector(map[string]string{"table.include.list": tc.list}), Options{Brokers: []string{"kafka:9092"}})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "table.include.list entry") {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cfg := config.Default()
			if err := config.Decode(res.YAML, &cfg); err != nil {
				t.Fatalf("output does not decode: %v\n%s", err, res.YAML)
			}
			cfg.Postgres.DSN = WithoutFiles(cfg.Postgres.DSN)
			if err := cfg.Validate(); err != nil {
				t.Fatalf("output does not validate: %v\n%s", err, res.YAML)
			}
			got := []string{cfg.Postgres.Table}
			if len(tc.want) > 1 || strings.Contains(tc.want[0], "*") {
				got = nil
				for _, e := range cfg.Postgres.Tables {
					got = append(got, e.Name)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("tables %v, want %v", got, tc.want)
			}
		})
	}
}

// connector is a minimal convertible connector with the given settings added
// (or removed, when ""). The EventRouter is transforms.outbox.
func connector(settings map[string]string) Connector {
	c := map[string]string{
		"connector.class":        PostgresConnector,
		"database.hostname":      "db",
		"database.user":          "dbz",
		"database.dbname":        "app",
		"plugin.name":            "pgoutput",
		"table.include.list":     "public.outbox",
		"key.converter":          "org.apache.kafka.connect.storage.StringConverter",
		"value.converter":        "org.apache.kafka.connect.storage.StringConverter",
		"transforms":             "outbox",
		"transforms.outbox.type": EventRouter,
	}
	for k, v := range settings {
		if v == "" {
			delete(c, k)
			continue
		}
		c[k] = v
	}
	return Connector{Name: "test", Config: c}
}

// TestConvertErrors checks that settings outboxd cannot honour stop the
// conversion with an error naming the setting and what to do.
func TestConvertErrors(t *testing.T) {
	const provider = "is a Kafka Connect config provider reference"
	for _, tc := range []struct {
		name     string
		settings map[string]string
		want     []string // substrings of the error
	}{
		{"class intersection", map[string]string{"transforms.outbox.route.topic.regex": "(?<routedByValue>[a-z&&[^x]]+)"},
			[]string{"transforms.outbox.route.topic.regex", "intersection", "rewrite the class without &&", "router.topic_regex"}},
		{"publication from a file", map[string]string{"publication.name": "${file:/opt/secrets.properties:pub}"},
			[]string{"publication.name " + provider + " (${file:...})", "replace it with its value", "OUTBOXD_"}},
		{"slot from the environment", map[string]string{"slot.name": "${env:SLOT}"}, []string{"slot.name " + provider + " (${env:...})"}},
		{"host from vault", map[string]string{"database.hostname": "${vault:secret/db:host}"}, []string{"database.hostname " + provider}},
		{"port", map[string]string{"database.port": "${env:PORT}"}, []string{"database.port " + provider}},
		{"user within text", map[string]string{"database.user": "app_${env:ENV}"}, []string{"database.user " + provider}},
		{"plugin", map[string]string{"plugin.name": "${env:PLUGIN}"}, []string{"plugin.name " + provider}},
		{"autocreate mode", map[string]string{"publication.autocreate.mode": "${env:MODE}"}, []string{"publication.autocreate.mode " + provider}},
		{"table", map[string]string{"table.include.list": "${file:/c.properties:table}"}, []string{"table.include.list " + provider}},
		{"certificate", map[string]string{"database.sslrootcert": "${file:/c.properties:ca}"}, []string{"database.sslrootcert " + provider}},
		{"transforms", map[string]string{"transforms": "${env:TRANSFORMS}"}, []string{"transforms " + provider}},
		{"key column", map[string]string{"transforms.outbox.table.field.event.key": "${env:KEY}"}, []string{"transforms.outbox.table.field.event.key " + provider}},
		{"topic replacement", map[string]string{"transforms.outbox.route.topic.replacement": "${env:PREFIX}.${routedByValue}"},
			[]string{"transforms.outbox.route.topic.replacement " + provider}},
		{"expand", map[string]string{"transforms.outbox.table.expand.json.payload": "${env:EXPAND}"}, []string{"table.expand.json.payload " + provider}},
		{"brokers", map[string]string{"producer.override.bootstrap.servers": "${env:BROKERS}"}, []string{"producer.override.bootstrap.servers " + provider}},
		{"client id", map[string]string{"producer.override.client.id": "${env:CLIENT}"}, []string{"producer.override.client.id " + provider}},
		{"value converter", map[string]string{"value.converter": "${env:CONVERTER}"}, []string{"value.converter " + provider}},
		{"null behaviour", map[string]string{"transforms.outbox.table.expand.json.payload": "true", "transforms.outbox.table.json.payload.null.behavior": "keep"},
			[]string{`table.json.payload.null.behavior "keep" is not ignore or optional_bytes`}},
		{"empty array behaviour", map[string]string{"transforms.outbox.table.json.payload.empty.array.behavior": "keep"},
			[]string{"is not ignore or optional_string"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Convert(connector(tc.settings), Options{}) // brokers from the connector
			if err == nil {
				t.Fatalf("converted:\n%s\nwarnings: %v", res.YAML, res.Warnings)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestConvertWarnings checks the warnings (and their absence) for settings
// outboxd honours differently.
func TestConvertWarnings(t *testing.T) {
	const (
		nullKey  = "transforms.outbox.table.json.payload.null.behavior"
		arrayKey = "transforms.outbox.table.json.payload.empty.array.behavior"
		expand   = "transforms.outbox.table.expand.json.payload"
	)
	jsonValues := map[string]string{"value.converter": jsonConverter, "value.converter.schemas.enable": "false"}
	with := func(a, b map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range a {
			m[k] = v
		}
		for k, v := range b {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name     string
		settings map[string]string
		want     map[string][]string // warning key: substrings of its message
		absent   []string            // warning keys that must not appear
		never    string              // text no warning may hold
	}{
		{name: "expanded, behaviours unset", settings: with(jsonValues, map[string]string{expand: "true"}),
			want:   map[string][]string{expand: {"top-level JSON array", "poison row"}},
			absent: []string{nullKey, arrayKey, "value.converter"}}, // outboxd expands as Debezium did
		{name: "expanded, behaviours ignore", settings: map[string]string{expand: "true", nullKey: "IGNORE", arrayKey: "ignore"},
			absent: []string{nullKey, arrayKey}},
		{name: "expanded, values kept", settings: map[string]string{expand: "true", nullKey: "optional_bytes", arrayKey: "optional_string"},
			want: map[string][]string{nullKey: {"is optional_bytes", "drops them"}, arrayKey: {"is optional_string", "drops them"}}},
		{name: "not expanded", settings: map[string]string{nullKey: "ignore", arrayKey: "optional_string"},
			absent: []string{nullKey, arrayKey}},
		{name: "password from a provider", settings: map[string]string{"database.password": "${file:/opt/connect.properties:pw}"},
			want:  map[string][]string{"database.password": {"config provider reference (${file:...})", "PGPASSWORD", "postgres.password_file", "OUTBOXD_POSTGRES_DSN"}},
			never: "/opt/connect.properties"},
		{name: "ssl password from a provider", settings: map[string]string{"database.sslpassword": "${env:KEY_PW}"},
			want: map[string][]string{"database.sslpassword": {"config provider reference (${env:...})", "PGSSLPASSWORD"}}},
		{name: "routedByValue is no provider", settings: map[string]string{"transforms.outbox.route.topic.replacement": "events.${routedByValue}"}},
		{name: "provider in an ignored setting", settings: map[string]string{"producer.override.sasl.jaas.config": "${file:/jaas.properties:config}"},
			want: map[string][]string{"producer.override.sasl.jaas.config": {"ignored"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Convert(connector(tc.settings), Options{Brokers: []string{"k:9092"}})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, w := range res.Warnings {
				got[w.Key] += w.Message + "\n"
				if tc.never != "" && strings.Contains(w.Message, tc.never) {
					t.Errorf("warning %s holds %q", w, tc.never)
				}
			}
			for key, subs := range tc.want {
				for _, sub := range subs {
					if !strings.Contains(got[key], sub) {
						t.Errorf("warning on %s = %q; want one containing %q", key, got[key], sub)
					}
				}
			}
			for _, key := range tc.absent {
				if got[key] != "" {
					t.Errorf("unexpected warning on %s: %s", key, got[key])
				}
			}
			loadBack(t, res.YAML)
		})
	}
}

// The key converter decides the key bytes, and so each key's partition:
// JsonConverter with schemas on (its default) wrote envelopes, which
// key_encoding json_schema writes too, and an unset key.converter is taken
// to be the worker's usual JsonConverter with schemas on, with a warning.
func TestConvertKeyEncoding(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings map[string]string
		want     string
		warns    bool
	}{
		{"JsonConverter, schemas by default", map[string]string{"key.converter": jsonConverter}, "json_schema", false},
		{"JsonConverter, schemas on", map[string]string{"key.converter": jsonConverter, "key.converter.schemas.enable": "true"}, "json_schema", false},
		{"JsonConverter, schemas off", map[string]string{"key.converter": jsonConverter, "key.converter.schemas.enable": "false"}, "json", false},
		{"StringConverter", map[string]string{"key.converter": stringConverter}, "string", false},
		{"worker's converter", map[string]string{"key.converter": ""}, "json_schema", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Convert(connector(tc.settings), Options{Brokers: []string{"k:9092"}})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(res.YAML), "key_encoding: "+tc.want+" ") {
				t.Errorf("want key_encoding: %s in\n%s", tc.want, res.YAML)
			}
			warned := false
			for _, w := range res.Warnings {
				warned = warned || w.Key == "key.converter" || w.Key == "key.converter.schemas.enable"
			}
			if warned != tc.warns {
				t.Errorf("warned about the key converter: %v, want %v (%v)", warned, tc.warns, res.Warnings)
			}
			loadBack(t, res.YAML)
		})
	}
}

// TestConvertSlotFailover: slot.failover maps to postgres.failover_slot,
// without a warning; a value that is not a boolean is an error.
func TestConvertSlotFailover(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value string // "" leaves slot.failover unset
		want  bool
		err   string
	}{
		{"unset", "", false, ""},
		{"true", "true", true, ""},
		{"TRUE", "TRUE", true, ""},
		{"false", "false", false, ""},
		{"not a boolean", "yes", false, `slot.failover "yes" is not true or false`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			settings := map[string]string{}
			if tc.value != "" {
				settings["slot.failover"] = tc.value
			}
			res, err := Convert(connector(settings), Options{Brokers: []string{"k:9092"}})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range res.Warnings {
				if w.Key == "slot.failover" {
					t.Errorf("warned about slot.failover: %v", w)
				}
			}
			if cfg := loadBack(t, res.YAML); cfg.Postgres.FailoverSlot != tc.want {
				t.Errorf("failover_slot = %v, want %v in\n%s", cfg.Postgres.FailoverSlot, tc.want, res.YAML)
			}
		})
	}
}
