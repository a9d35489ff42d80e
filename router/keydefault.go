package router

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Debezium's PostgresDefaultValueConverter patterns: a literal '...' (with
// ” for a quote), and a function call, whose value Debezium cannot know and
// replaces with a placeholder.
var (
	literalDefault  = regexp.MustCompile(`'([^']*(?:''[^']*)*)'`)
	functionDefault = regexp.MustCompile(`^[(]?[A-Za-z0-9_.]+\((?:.+(?:, ?.+)*)?\)`)
)

var currentDateTimes = map[string]bool{"current_timestamp": true, "current_time": true, "current_date": true, "localtime": true, "localtimestamp": true}

// keyDefault returns the "default" Debezium put into the key column's
// Connect schema, as JsonConverter writes it, for the column's DEFAULT
// expression expr (as pg_get_expr prints it) and base type oid: nil when
// Debezium put none. It reproduces PostgresDefaultValueConverter: a function
// call or CURRENT_* is a placeholder (a uuid of zeros, 0, false, "" or
// "{}"), a literal is its text, NULL::type or an expression it cannot parse
// is no default. It refuses what it cannot reproduce exactly: a domain
// (Debezium finds no mapper for its name and logs; outboxd cannot tell that
// apart) and a uuid literal Java's lenient UUID.fromString would rewrite.
func keyDefault(expr string, oid uint32, domain bool) ([]byte, error) {
	if expr == "" {
		return nil, nil
	}
	if domain {
		return nil, fmt.Errorf("its type is a domain, whose default Debezium's schema may or may not carry")
	}
	switch oid {
	case oidText, oidVarchar, oidBpchar:
		return defaultString(expr, "")
	case oidJSON, oidJSONB:
		return defaultString(expr, "{}")
	case oidUUID:
		v, ok := extractDefault(strings.TrimSpace(expr), "00000000-0000-0000-0000-000000000000")
		if !ok {
			return nil, nil
		}
		if !canonicalUUID(v) {
			return nil, fmt.Errorf("its default %s is not a uuid in canonical form, which Java's UUID.fromString would rewrite", expr)
		}
		return appendJacksonString(nil, []byte(strings.ToLower(v))), nil
	case oidInt2, oidInt4, oidInt8:
		expr = strings.TrimSpace(expr)
		if strings.HasPrefix(expr, "NULL::") {
			return nil, nil
		}
		v, ok := extractDefault(expr, "0")
		if !ok {
			return nil, nil
		}
		bits := map[uint32]int{oidInt2: 16, oidInt4: 32, oidInt8: 64}[oid]
		n, err := strconv.ParseInt(v, 10, bits) // as Short/Integer/Long.parseX: sign and digits
		if err != nil {
			return nil, nil // Debezium logs that it cannot parse it and puts no default
		}
		return strconv.AppendInt(nil, n, 10), nil
	case oidBool:
		expr = strings.TrimSpace(expr)
		if strings.HasPrefix(expr, "NULL::") {
			return nil, nil
		}
		v, ok := extractDefault(expr, "false")
		if !ok {
			return nil, nil
		}
		return strconv.AppendBool(nil, strings.EqualFold(v, "true")), nil // Boolean.parseBoolean
	}
	return nil, fmt.Errorf("outboxd does not reproduce Debezium's default for its type")
}

func defaultString(expr, placeholder string) ([]byte, error) {
	v, ok := extractDefault(expr, placeholder)
	if !ok {
		return nil, nil
	}
	return appendJacksonString(nil, []byte(v)), nil
}

// extractDefault is Debezium's extractDefault(value, placeholder): the
// placeholder for a function call, else the literal's text, else the
// expression itself; ok is false for NULL::type and an expression whose
// quotes do not make a literal (no default).
func extractDefault(expr, placeholder string) (string, bool) {
	if functionDefault.MatchString(expr) || currentDateTimes[strings.ToLower(expr)] {
		return placeholder, true
	}
	if !strings.Contains(expr, "'") {
		return expr, !strings.HasPrefix(expr, "NULL::")
	}
	m := literalDefault.FindStringSubmatch(expr)
	if m == nil {
		return "", false
	}
	return strings.ReplaceAll(m[1], "''", "'"), true
}

func canonicalUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'):
			return false
		}
	}
	return true
}
