package replay

import (
	"errors"
	"fmt"
	"strings"
)

// CheckWhere checks the shape of an operator's -where clause before it is
// put into SQL: one condition, which the replay places inside parentheses
// between its own conditions. It refuses what would change the statement
// around it rather than filter rows: a ';' (a second statement), a
// parenthesis it closes without opening or leaves open, and an
// unterminated string, quoted identifier or comment. It reads SQL's
// lexical structure only (strings, escape strings, quoted identifiers,
// dollar quotes, comments) and refuses parameters ($1), which would take
// the values the replay binds. Whether the condition is valid is for
// Postgres to say, in a READ ONLY transaction (see Open).
func CheckWhere(clause string) error {
	if strings.TrimSpace(clause) == "" {
		return errors.New("-where is empty; give the condition the rows to replay match, e.g. -where \"created_at >= '2026-01-01'\" (-where true replays every row)")
	}
	depth := 0
	for i := 0; i < len(clause); {
		c := clause[i]
		switch {
		case c == '\'':
			// E'...' strings take backslash escapes; others do not
			// (standard_conforming_strings, on since Postgres 9.1).
			escapes := i > 0 && (clause[i-1] == 'E' || clause[i-1] == 'e') && (i < 2 || !identChar(clause[i-2]))
			end, ok := closeQuote(clause, i+1, '\'', escapes)
			if !ok {
				return fmt.Errorf("-where leaves the string starting at character %d unterminated; close it with '", i+1)
			}
			i = end
		case c == '"':
			end, ok := closeQuote(clause, i+1, '"', false)
			if !ok {
				return fmt.Errorf("-where leaves the quoted identifier starting at character %d unterminated; close it with \"", i+1)
			}
			i = end
		case c == '$' && (i == 0 || !identChar(clause[i-1])):
			if i+1 < len(clause) && clause[i+1] >= '0' && clause[i+1] <= '9' {
				return fmt.Errorf("-where holds a parameter ($%c...) at character %d; write the value into the condition", clause[i+1], i+1)
			}
			tag, ok := dollarTag(clause[i:])
			if !ok {
				i++
				continue
			}
			end := strings.Index(clause[i+len(tag):], tag)
			if end < 0 {
				return fmt.Errorf("-where leaves the dollar-quoted string starting at character %d unterminated; close it with %s", i+1, tag)
			}
			i += len(tag) + end + len(tag)
		case strings.HasPrefix(clause[i:], "--"):
			end := strings.IndexByte(clause[i:], '\n')
			if end < 0 {
				return nil // ends the clause; the replay puts a newline after it
			}
			i += end + 1
		case strings.HasPrefix(clause[i:], "/*"):
			end, ok := closeComment(clause, i)
			if !ok {
				return fmt.Errorf("-where leaves the comment starting at character %d unterminated; close it with */", i+1)
			}
			i = end
		case c == ';':
			return fmt.Errorf("-where holds a ';' at character %d: give one condition, not statements", i+1)
		case c == '(':
			depth++
			i++
		case c == ')':
			if depth--; depth < 0 {
				return fmt.Errorf("-where closes a parenthesis at character %d that it did not open: give one condition, with its parentheses balanced", i+1)
			}
			i++
		default:
			i++
		}
	}
	if depth > 0 {
		return fmt.Errorf("-where leaves %d parenthesis(es) open: give one condition, with its parentheses balanced", depth)
	}
	return nil
}

func identChar(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

// closeQuote returns the index just past the quote q that closes a string
// or identifier whose body starts at from; a doubled quote is one quote
// inside it.
func closeQuote(s string, from int, q byte, escapes bool) (int, bool) {
	for i := from; i < len(s); i++ {
		switch {
		case escapes && s[i] == '\\':
			i++
		case s[i] == q && i+1 < len(s) && s[i+1] == q:
			i++
		case s[i] == q:
			return i + 1, true
		}
	}
	return 0, false
}

// dollarTag returns the opening $tag$ (or $$) that s starts with.
func dollarTag(s string) (string, bool) {
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '$':
			return s[:i+1], true
		case c >= '0' && c <= '9' && i == 1, !identChar(c):
			return "", false
		}
	}
	return "", false
}

// closeComment returns the index just past the */ that closes the block
// comment at from; block comments nest in Postgres.
func closeComment(s string, from int) (int, bool) {
	depth := 0
	for i := from; i+1 < len(s); i++ {
		switch s[i : i+2] {
		case "/*":
			depth++
			i++
		case "*/":
			if depth--; depth == 0 {
				return i + 2, true
			}
			i++
		}
	}
	return 0, false
}
