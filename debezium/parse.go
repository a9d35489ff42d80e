package debezium

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Connector is a Kafka Connect connector configuration.
type Connector struct {
	Name   string            // the connector's name, "" when the input has none
	Config map[string]string // the connector's settings
}

// Format of a connector configuration.
type Format int

// Formats Parse reads.
const (
	Auto       Format = iota // JSON when the input starts with '{', else properties
	JSON                     // as posted to Kafka Connect's REST API
	Properties               // as given to connect-standalone
)

// Parse reads a connector configuration: JSON as posted to Kafka Connect
// ({"name": ..., "config": {...}}, or the bare config object as PUT to
// /connectors/NAME/config), or a Java .properties file. Errors never quote
// the input, which may hold a password.
func Parse(data []byte, f Format) (Connector, error) {
	if f == Auto {
		f = Properties
		if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
			f = JSON
		}
	}
	if f == JSON {
		return parseJSON(data)
	}
	cfg, err := parseProperties(data)
	if err != nil {
		return Connector{}, err
	}
	c := Connector{Name: cfg["name"], Config: cfg}
	return c, nil
}

func parseJSON(data []byte) (Connector, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return Connector{}, jsonError(err)
	}
	var c Connector
	body := top
	if raw, ok := top["config"]; ok && len(bytes.TrimSpace(raw)) > 0 && bytes.TrimSpace(raw)[0] == '{' {
		body = nil
		if err := json.Unmarshal(raw, &body); err != nil {
			return Connector{}, jsonError(err)
		}
		if n, ok := top["name"]; ok {
			if err := json.Unmarshal(n, &c.Name); err != nil {
				return Connector{}, errors.New(`"name" must be a string`)
			}
		}
	}
	c.Config = make(map[string]string, len(body))
	keys := make([]string, 0, len(body))
	for k := range body {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		raw := bytes.TrimSpace(body[k])
		switch {
		case len(raw) == 0 || string(raw) == "null":
			continue
		case raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return Connector{}, fmt.Errorf("setting %q is not a valid JSON string", k)
			}
			c.Config[k] = s
		case raw[0] == '{' || raw[0] == '[':
			return Connector{}, fmt.Errorf("setting %q is an object or array; Kafka Connect settings are strings", k)
		default: // number or boolean: Connect accepts them as their text
			c.Config[k] = string(raw)
		}
	}
	if c.Name == "" {
		c.Name = c.Config["name"]
	}
	return c, nil
}

// jsonError describes a JSON error by position only: encoding/json's
// messages can quote the input.
func jsonError(err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("not valid JSON (syntax error at byte %d)", se.Offset)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("not a connector configuration: expected a JSON object of settings, found a %s", te.Value)
	}
	return errors.New("not valid JSON")
}

// parseProperties reads the java.util.Properties text format: key=value,
// key:value or "key value"; '#' and '!' comments; a trailing backslash
// continues a line; \t \n \r \f \uXXXX and \<char> escapes.
func parseProperties(data []byte) (map[string]string, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("not a text file (invalid UTF-8)")
	}
	out := map[string]string{}
	lines := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		lineNo := i + 1
		line := strings.TrimLeft(lines[i], " \t\f")
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		// Join continuation lines: an odd number of trailing backslashes.
		for endsWithContinuation(line) && i+1 < len(lines) {
			i++
			line = line[:len(line)-1] + strings.TrimLeft(lines[i], " \t\f")
		}
		if endsWithContinuation(line) {
			line = line[:len(line)-1]
		}
		key, value := splitProperty(line)
		k, err := unescapeProperty(key)
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", lineNo, err)
		}
		v, err := unescapeProperty(value)
		if err != nil {
			return nil, fmt.Errorf("line %d (setting %q): %v", lineNo, k, err)
		}
		out[k] = v
	}
	return out, nil
}

func endsWithContinuation(s string) bool {
	n := 0
	for i := len(s) - 1; i >= 0 && s[i] == '\\'; i-- {
		n++
	}
	return n%2 == 1
}

// splitProperty splits at the first unescaped '=', ':' or whitespace.
func splitProperty(line string) (key, value string) {
	i := 0
	for i < len(line) {
		c := line[i]
		if c == '\\' {
			i += 2
			continue
		}
		if c == '=' || c == ':' || c == ' ' || c == '\t' || c == '\f' {
			break
		}
		i++
	}
	if i >= len(line) {
		return line, ""
	}
	key, rest := line[:i], line[i:]
	rest = strings.TrimLeft(rest, " \t\f")
	if rest != "" && (rest[0] == '=' || rest[0] == ':') {
		rest = strings.TrimLeft(rest[1:], " \t\f")
	}
	return key, rest
}

func unescapeProperty(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch s[i] {
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 'f':
			b.WriteByte('\f')
		case 'u':
			r, ok := hex4(s[i+1:])
			if !ok {
				return "", errors.New(`malformed \uXXXX escape`)
			}
			i += 4
			// java.util.Properties reads UTF-16 code units: a high and a
			// low surrogate are one code point. A lone one becomes U+FFFD.
			if utf16.IsSurrogate(r) && strings.HasPrefix(s[i+1:], `\u`) {
				if lo, ok := hex4(s[i+3:]); ok {
					if pair := utf16.DecodeRune(r, lo); pair != utf8.RuneError {
						r = pair
						i += 6
					}
				}
			}
			b.WriteRune(r)
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String(), nil
}

// hex4 reads the four hex digits of a \uXXXX escape at the start of s.
func hex4(s string) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	n, err := strconv.ParseUint(s[:4], 16, 16)
	return rune(n), err == nil
}
