package config

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// setting is one leaf of Config as a user meets it: its YAML path, its
// environment variable and its default, rendered as docs/configuration.md
// writes it.
type setting struct {
	path, env, def string
}

// settings lists every setting of Config, in struct order. The YAML path
// comes from the yaml tags; the environment name is the one applyEnv
// accepts (collect's map, matched by field address), so the list follows
// the code's mapping instead of restating it.
func settings(t *testing.T) []setting {
	t.Helper()
	cfg := Default()
	envs := map[uintptr]string{}
	byName := map[string]reflect.Value{}
	collect(reflect.ValueOf(&cfg).Elem(), EnvPrefix, byName)
	for name, f := range byName {
		envs[f.UnsafeAddr()] = name
	}
	var out []setting
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		for i := range v.NumField() {
			tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("yaml"), ",")
			p := tag
			if path != "" {
				p = path + "." + tag
			}
			f := v.Field(i)
			if f.Kind() == reflect.Struct && f.Type() != reflect.TypeOf(time.Duration(0)) {
				walk(f, p)
				continue
			}
			env, ok := envs[f.UnsafeAddr()]
			if !ok {
				t.Errorf("setting %s has no environment variable", p)
			}
			out = append(out, setting{path: p, env: env, def: render(f.Interface())})
		}
	}
	walk(reflect.ValueOf(&cfg).Elem(), "")
	if len(out) != len(byName) {
		t.Errorf("%d settings by YAML path, %d environment variables", len(out), len(byName))
	}
	return out
}

// render writes a default as the documentation shows it.
func render(v any) string {
	switch v := v.(type) {
	case time.Duration:
		s := v.String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return s
	case string:
		if v == "" {
			return `""`
		}
		return v
	case []string:
		return "[" + strings.Join(v, ", ") + "]"
	case []Field:
		parts := make([]string, len(v))
		for i, f := range v {
			parts[i] = f.Column + ":" + string(f.Placement) + ":" + f.Alias
		}
		return "[" + strings.Join(parts, ", ") + "]"
	default:
		return fmt.Sprint(v)
	}
}

// docRow is a settings table row of docs/configuration.md.
type docRow struct {
	def, env, meaning string
	line              int
}

var codeCell = regexp.MustCompile("^`([^`]*)`$")

// docRows reads the rows of docs/configuration.md's tables whose first cell
// is a setting in backquotes: | `path` | `default` | `ENV` | meaning |.
func docRows(t *testing.T, path string) map[string]docRow {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]docRow{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		m := codeCell.FindStringSubmatch(cells[0])
		if m == nil || len(cells) < 4 {
			continue
		}
		unquote := func(c string) string {
			if m := codeCell.FindStringSubmatch(c); m != nil {
				return m[1]
			}
			return "not in backquotes: " + c
		}
		if prev, ok := rows[m[1]]; ok {
			t.Errorf("%s:%d: %s is documented twice (also line %d)", path, n, m[1], prev.line)
		}
		rows[m[1]] = docRow{def: unquote(cells[1]), env: unquote(cells[2]), meaning: strings.Join(cells[3:], " | "), line: n}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestConfigurationDoc fails when docs/configuration.md misses a setting,
// gives a wrong default or environment variable, or documents a setting
// the code does not have.
func TestConfigurationDoc(t *testing.T) {
	const doc = "../docs/configuration.md"
	rows := docRows(t, doc)
	seen := map[string]bool{}
	for _, s := range settings(t) {
		seen[s.path] = true
		r, ok := rows[s.path]
		if !ok {
			t.Errorf("%s: setting %s is missing; add | `%s` | `%s` | `%s` | meaning |", doc, s.path, s.path, s.def, s.env)
			continue
		}
		if r.def != s.def {
			t.Errorf("%s:%d: %s defaults to `%s`, not `%s`", doc, r.line, s.path, s.def, r.def)
		}
		if r.env != s.env {
			t.Errorf("%s:%d: %s is set by `%s`, not `%s`", doc, r.line, s.path, s.env, r.env)
		}
		if strings.TrimSpace(r.meaning) == "" {
			t.Errorf("%s:%d: %s has no meaning", doc, r.line, s.path)
		}
	}
	for path, r := range rows {
		if !seen[path] {
			t.Errorf("%s:%d: %s is not a setting of config.Config", doc, r.line, path)
		}
	}
}

// TestRender pins the forms the documentation uses for defaults.
func TestRender(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want string
	}{
		{2 * time.Minute, "2m"},
		{90 * time.Second, "1m30s"},
		{time.Millisecond, "1ms"},
		{2 * time.Hour, "2h"},
		{"", `""`},
		{[]string{"a:1", "b:2"}, "[a:1, b:2]"},
		{[]string(nil), "[]"},
		{[]Field(nil), "[]"},
		{-1, "-1"},
		{true, "true"},
	} {
		if got := render(tc.v); got != tc.want {
			t.Errorf("render(%#v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

// docFiles are the documents whose snippets TestDocSnippets checks.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"../README.md", "../DESIGN.md", "../RELIABILITY.md", "../BENCHMARKS.md", "../CHANGELOG.md"}
	more, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append(files, more...)
}

// block is a fenced code block of a Markdown file.
type block struct {
	lang, text string
	line       int
}

func blocks(t *testing.T, path string) []block {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []block
	var cur *block
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &block{lang: strings.TrimPrefix(trimmed, "```"), line: i + 1}
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	return out
}

// TestDocSnippets checks what can be checked cheaply in the documents'
// examples: every YAML block that sets outboxd settings decodes with the
// strict loader and validates (the files it names are not read), and every `make TARGET` in a document or a shell block names a
// target of the Makefile.
func TestDocSnippets(t *testing.T) {
	sectionKeys := map[string]bool{}
	for _, k := range sections()["Config"].keys {
		sectionKeys[k] = true
	}
	targets := makeTargets(t)
	for _, path := range docFiles(t) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range makeCommands(string(data), blocks(t, path)) {
			for _, target := range cmd.targets {
				if !targets[target] {
					t.Errorf("%s: `%s`: the Makefile has no target %s", path, cmd.text, target)
				}
			}
		}
		for _, b := range blocks(t, path) {
			if b.lang != "yaml" || !isConfig(b.text, sectionKeys) {
				continue
			}
			cfg := Default()
			if err := Decode([]byte(b.text), &cfg); err != nil {
				t.Errorf("%s:%d: the YAML example does not load: %v", path, b.line, err)
				continue
			}
			cfg.Postgres.PasswordFile = ""
			if fileParam.MatchString(cfg.Postgres.DSN) {
				cfg.Postgres.DSN = Default().Postgres.DSN // pgconn reads the files it names
			}
			if cfg.Kafka.SASL.PasswordFile != "" {
				cfg.Kafka.SASL.PasswordFile, cfg.Kafka.SASL.Password = "", "x"
			}
			cfg.Kafka.TLS = TLS{}
			if err := cfg.Validate(); err != nil {
				t.Errorf("%s:%d: the YAML example does not validate: %v", path, b.line, err)
			}
		}
	}
}

var fileParam = regexp.MustCompile(`ssl(rootcert|cert|key)=`)

// isConfig reports whether a YAML block is an outboxd configuration: one of
// its top-level keys is a section of Config. Other YAML (Kubernetes,
// Compose, Prometheus) is left alone.
func isConfig(text string, keys map[string]bool) bool {
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == ' ' || line[0] == '#' || line[0] == '-' {
			continue
		}
		key, _, ok := strings.Cut(line, ":")
		if ok && keys[strings.TrimSpace(key)] {
			return true
		}
	}
	return false
}

// makeCommand is a make command line a document shows.
type makeCommand struct {
	text    string
	targets []string
}

var (
	inlineMake = regexp.MustCompile("`(make [^`]*)`")
	shellMake  = regexp.MustCompile(`(?m)^\s*(?:[A-Z_]+=\S+\s+)*(make(?:\s+[^#\s]+)*)`)
)

// makeCommands finds the make commands of a document: in inline code and at
// the start of lines of shell blocks. Each word after make that is not a
// VAR=value assignment is a target.
func makeCommands(doc string, bs []block) []makeCommand {
	var texts []string
	for _, m := range inlineMake.FindAllStringSubmatch(doc, -1) {
		texts = append(texts, m[1])
	}
	for _, b := range bs {
		if b.lang != "sh" && b.lang != "bash" && b.lang != "" {
			continue
		}
		for _, m := range shellMake.FindAllStringSubmatch(b.text, -1) {
			texts = append(texts, m[1])
		}
	}
	var out []makeCommand
	for _, text := range texts {
		c := makeCommand{text: text}
		for _, w := range strings.Fields(text)[1:] {
			if !strings.Contains(w, "=") && !strings.HasPrefix(w, "-") {
				c.targets = append(c.targets, w)
			}
		}
		out = append(out, c)
	}
	return out
}

// makeTargets reads the Makefile's rule names.
func makeTargets(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	rule := regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`)
	out := map[string]bool{}
	for _, m := range rule.FindAllStringSubmatch(string(data), -1) {
		out[m[1]] = true
	}
	if !out["test"] {
		t.Fatalf("no rules found in the Makefile: %v", out)
	}
	return out
}

// TestDocOutboxdCommands checks the outboxd command lines of the documents'
// shell blocks: each subcommand is one cmd/outboxd dispatches, and each
// flag one that cmd/outboxd (or, for debezium convert, package debezium)
// defines.
func TestDocOutboxdCommands(t *testing.T) {
	source := func(glob string) string {
		files, err := filepath.Glob(glob)
		if err != nil || len(files) == 0 {
			t.Fatalf("no files match %s", glob)
		}
		var b strings.Builder
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(data)
		}
		return b.String()
	}
	main, dbz := source("../cmd/outboxd/*.go"), source("../debezium/*.go")
	flagDef := regexp.MustCompile(`fs\.(?:Bool|String|Int|Duration)(?:Var)?\((?:&[\w.]+, )?"([a-z-]+)"`)
	flags := func(src string) map[string]bool {
		out := map[string]bool{}
		for _, m := range flagDef.FindAllStringSubmatch(src, -1) {
			out[m[1]] = true
		}
		return out
	}
	mainFlags, dbzFlags := flags(main), flags(dbz)
	subs := map[string]bool{"debezium": true}
	for _, m := range regexp.MustCompile(`case ((?:"[a-z]+",? ?)+):|\{("[a-z]+"), "outboxd`).FindAllStringSubmatch(main, -1) {
		m[1] += m[2] // a case of the dispatch, or an entry of cmd/outboxd's subcommands
		for _, s := range regexp.MustCompile(`"([a-z]+)"`).FindAllStringSubmatch(m[1], -1) {
			subs[s[1]] = true
		}
	}
	line := regexp.MustCompile(`(?m)^\s*(?:[A-Z_]+=\S+\s+)*outboxd\s+([^#\n]*)`)
	checked := 0
	for _, path := range docFiles(t) {
		for _, b := range blocks(t, path) {
			if b.lang != "sh" && b.lang != "bash" {
				continue
			}
			for _, m := range line.FindAllStringSubmatch(b.text, -1) {
				words := strings.Fields(m[1])
				known := mainFlags
				if len(words) > 0 && !strings.HasPrefix(words[0], "-") {
					if !subs[words[0]] {
						t.Errorf("%s:%d: outboxd %s: no such subcommand", path, b.line, words[0])
					}
					if words[0] == "debezium" {
						known = dbzFlags
					}
				}
				for _, w := range words {
					name, ok := strings.CutPrefix(w, "-")
					if !ok || strings.HasPrefix(name, "-") || name == "" {
						continue
					}
					name = strings.TrimPrefix(strings.Trim(name, "[]"), "-")
					if n, _, _ := strings.Cut(name, "="); !known[n] && !known[strings.Trim(n, "[]")] {
						t.Errorf("%s:%d: outboxd %s: no flag -%s", path, b.line, m[1], n)
					}
				}
				checked++
			}
		}
	}
	if checked == 0 {
		t.Error("no outboxd command lines found in the documents")
	}
}

// pendingAnchors are links to sections being written; remove an entry when
// its section is there.
var pendingAnchors = map[string]bool{}

// TestDocLinks checks the documents' relative links: every linked file
// exists, and an anchor into a document names one of its headings.
func TestDocLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := map[string]bool{}
		data, _ := os.ReadFile(path)
		inCode := false
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inCode = !inCode
			}
			if inCode || !strings.HasPrefix(line, "#") {
				continue
			}
			h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
			a[strings.ReplaceAll(drop.ReplaceAllString(h, ""), " ", "-")] = true
		}
		anchors[path] = a
		return a
	}
	for _, doc := range docFiles(t) {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(data), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := doc
			if file != "" {
				path = filepath.Join(filepath.Dir(doc), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %s: %s does not exist", doc, target, path)
				continue
			}
			if anchor == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			if rel, _ := filepath.Rel("..", path); pendingAnchors[filepath.ToSlash(rel)+"#"+anchor] {
				continue
			}
			if !anchorsOf(path)[anchor] {
				t.Errorf("%s: link %s: %s has no heading #%s", doc, target, path, anchor)
			}
		}
	}
}
