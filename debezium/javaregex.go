package debezium

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// replacementPart is a literal or a group reference of a Java replacement.
type replacementPart struct {
	literal string
	group   string // group name or number; "" for a literal
}

// parseJavaReplacement parses a java.util.regex.Matcher replacement string:
// "\c" is the literal c, "${name}" a named group, "$n" a numbered group
// (digits are taken while the number stays a group of re, as Java does).
func parseJavaReplacement(s string, re *regexp.Regexp) ([]replacementPart, error) {
	var parts []replacementPart
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			parts = append(parts, replacementPart{literal: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			if i+1 >= len(s) {
				return nil, errors.New(`ends with a lone '\'`)
			}
			i++
			lit.WriteByte(s[i])
		case '$':
			if i+1 >= len(s) {
				return nil, errors.New("ends with a lone '$' (write \\$ for a dollar sign)")
			}
			flush()
			if s[i+1] == '{' {
				end := strings.IndexByte(s[i:], '}')
				if end < 0 {
					return nil, errors.New("has '${' without a closing '}'")
				}
				name := s[i+2 : i+end]
				if !validGroupName(name) {
					return nil, fmt.Errorf("has an invalid group name %q", name)
				}
				if re.SubexpIndex(name) < 0 {
					return nil, fmt.Errorf("refers to group ${%s}, which the regex does not define", name)
				}
				parts = append(parts, replacementPart{group: name})
				i += end
				continue
			}
			if s[i+1] < '0' || s[i+1] > '9' {
				return nil, fmt.Errorf("has an illegal group reference at %q (write \\$ for a dollar sign)", s[i:i+2])
			}
			n := int(s[i+1] - '0')
			j := i + 2
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				m := n*10 + int(s[j]-'0')
				if m > re.NumSubexp() {
					break
				}
				n = m
				j++
			}
			if n > re.NumSubexp() {
				return nil, fmt.Errorf("refers to group $%d; the regex has %d", n, re.NumSubexp())
			}
			parts = append(parts, replacementPart{group: fmt.Sprint(n)})
			i = j - 1
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	return parts, nil
}

func validGroupName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// goTemplate writes parts in the syntax of regexp.Expand: "$$" for a dollar,
// "${g}" for a group.
func goTemplate(parts []replacementPart) string {
	var b strings.Builder
	for _, p := range parts {
		if p.group != "" {
			b.WriteString("${" + p.group + "}")
			continue
		}
		b.WriteString(strings.ReplaceAll(p.literal, "$", "$$"))
	}
	return b.String()
}

// Errors of compileJavaRegex complete the sentence "route.topic.regex R ...",
// and end with what to do; the caller adds the alternative of setting
// router.topic_regex by hand.
const (
	rewriteIt = "rewrite it"
	noRE2     = "which Go's regular expressions (RE2) do not support; " + rewriteIt
)

func lacks(what string) error { return fmt.Errorf("uses %s, %s", what, noRE2) }

// compileJavaRegex compiles a Java regex as Debezium's RegexRouter uses it:
// the whole value must match (Matcher.matches), so the result is anchored.
// It refuses the Java constructs that Go would read with another meaning, and
// names those Go lacks.
func compileJavaRegex(s string) (*regexp.Regexp, error) {
	if err := javaOnly(s); err != nil {
		return nil, err
	}
	re, err := regexp.Compile(`^(?:` + s + `)$`)
	if err != nil {
		return nil, fmt.Errorf("is not a regular expression Go accepts: %v; %s", strings.TrimPrefix(err.Error(), "error parsing regexp: "), rewriteIt)
	}
	return re, nil
}

// javaOnly scans a Java regex for the constructs of java.util.regex.Pattern
// that Go's syntax lacks (for a clearer message than the compiler's) or,
// worse, accepts with another meaning: class intersection and union, the
// inline flag U, \v and octal escapes. Go reads \Q...\E as Java does.
func javaOnly(s string) error {
	inClass := false
	classStart := false // just after "[" or "[^": a ']' here is a literal
	for i := 0; i < len(s); i++ {
		c := s[i]
		first := classStart
		classStart = false
		if c == '\\' {
			if i+1 >= len(s) {
				return nil // the compiler reports the trailing backslash
			}
			if s[i+1] == 'Q' {
				if inClass {
					return errors.New(`uses \Q...\E inside a character class, which Go's regular expressions (RE2) do not support; escape each character with '\' instead`)
				}
				end := strings.Index(s[i+2:], `\E`)
				if end < 0 {
					return nil // quoted to the end, in Go as in Java
				}
				i += 2 + end + 1 // at the 'E'; a quantifier may follow
				continue
			}
			n, err := javaEscape(s[i:])
			if err != nil {
				return err
			}
			i += n - 1
			continue
		}
		if inClass {
			switch {
			case c == ']' && !first:
				inClass = false
			case c == '[':
				return errors.New("has a '[' inside a character class, which Java reads as a nested class (a union) and Go's regular expressions (RE2) as a literal '[' (or a POSIX class like [:alpha:]); " +
					`rewrite the class as one, without nested brackets (for [a-z[0-9]], write [a-z0-9]; for a literal bracket, \[)`)
			case c == '&' && i+1 < len(s) && s[i+1] == '&':
				return errors.New("uses a character-class intersection (&& inside [...]), which Go's regular expressions (RE2) lack and would read as literal characters, matching other values than Java; " +
					"rewrite the class without &&, listing the characters it keeps (for [a-z&&[^x]], write [a-wyz])")
			}
			continue
		}
		switch c {
		case '[':
			inClass, classStart = true, true
			if i+1 < len(s) && s[i+1] == '^' {
				i++
			}
		case '(':
			n, err := javaGroup(s[i:])
			if err != nil {
				return err
			}
			i += n - 1
		case '*', '+', '?':
			if i+1 < len(s) && s[i+1] == '+' {
				return lacks("a possessive quantifier (" + s[i:i+2] + ")")
			}
		case '{':
			if n := repetition(s[i:]); n > 0 {
				if i+n < len(s) && s[i+n] == '+' {
					return lacks("a possessive quantifier (" + s[i:i+n+1] + ")")
				}
				i += n - 1
			}
		}
	}
	return nil
}

// javaEscape checks the escape at the start of s and returns its length.
func javaEscape(s string) (int, error) {
	switch e := s[1]; e {
	case '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return 0, lacks("backreferences")
	case 'k':
		return 0, lacks("named backreferences")
	case '0':
		return 0, errors.New(`uses an octal escape (\0...), which Go's regular expressions (RE2) read differently (\0123 is '\n' then '3' in Go, 'S' in Java); write \x{HH} instead`)
	case 'v':
		return 0, errors.New(`uses \v, which in Java matches any vertical whitespace and in Go's regular expressions (RE2) only a vertical tab; write [\n\x0B\f\r\x{85}\x{2028}\x{2029}] instead`)
	case 'G', 'Z', 'R', 'h', 'H', 'V', 'X':
		return 0, lacks(`\` + string(e))
	case 'x', 'p', 'P':
		if strings.HasPrefix(s[2:], "{java") {
			return 0, lacks(`\` + string(e) + `{java...} classes`)
		}
		if strings.HasPrefix(s[2:], "{") {
			if end := strings.IndexByte(s, '}'); end > 0 {
				return end + 1, nil
			}
		}
	}
	return 2, nil
}

// javaGroup checks the group opened at the start of s and returns the length
// of its opening ("(", "(?:", "(?<name>", "(?i)", ...).
func javaGroup(s string) (int, error) {
	if !strings.HasPrefix(s, "(?") {
		return 1, nil
	}
	for _, g := range []struct{ prefix, what string }{
		{"(?=", "lookahead"}, {"(?!", "negative lookahead"}, {"(?<=", "lookbehind"}, {"(?<!", "negative lookbehind"}, {"(?>", "atomic groups"},
	} {
		if strings.HasPrefix(s, g.prefix) {
			return 0, lacks(g.what)
		}
	}
	if strings.HasPrefix(s, "(?<") {
		if end := strings.IndexByte(s, '>'); end > 0 {
			return end + 1, nil
		}
		return 3, nil
	}
	// Inline flags: (?i), (?-s), (?is:...).
	for i := 2; i < len(s); i++ {
		switch f := s[i]; f {
		case ')', ':':
			return i + 1, nil
		case 'U':
			return 0, errors.New("uses the inline flag U, which in Java means Unicode character classes and in Go's regular expressions (RE2) ungreedy matching; remove it (Go's \\w, \\d and \\b are ASCII-only; use \\pL and \\pN for Unicode letters and digits)")
		case 'x', 'd', 'u':
			return 0, lacks("the inline flag " + string(f))
		case 'i', 'm', 's', '-':
		default:
			return 2, nil // not Java; the compiler reports it
		}
	}
	return 2, nil
}

// repetition returns the length of the {n}, {n,} or {n,m} at the start of s,
// or 0 when s does not start with one.
func repetition(s string) int {
	i := 1
	digits := func() int {
		j := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i - j
	}
	if digits() == 0 {
		return 0
	}
	if i < len(s) && s[i] == ',' {
		i++
		digits()
	}
	if i < len(s) && s[i] == '}' {
		return i + 1
	}
	return 0
}
