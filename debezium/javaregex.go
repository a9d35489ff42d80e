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

// javaOnly lists Java regex constructs that Go's RE2 syntax lacks, for a
// clearer message than the compiler's.
var javaOnly = []struct{ token, what string }{
	{"(?=", "lookahead"}, {"(?!", "negative lookahead"}, {"(?<=", "lookbehind"}, {"(?<!", "negative lookbehind"},
	{"(?>", "atomic groups"}, {`\k<`, "named backreferences"}, {"*+", "possessive quantifiers"},
	{"++", "possessive quantifiers"}, {"?+", "possessive quantifiers"}, {`\G`, `\G`}, {`\Z`, `\Z`},
	{`\R`, `\R`}, {`\h`, `\h`}, {`\p{java`, `\p{java...}` + " classes"},
}

var backref = regexp.MustCompile(`\\[1-9]`)

// compileJavaRegex compiles a Java regex as Debezium's RegexRouter uses it:
// the whole value must match (Matcher.matches), so the result is anchored.
func compileJavaRegex(s string) (*regexp.Regexp, error) {
	for _, j := range javaOnly {
		if strings.Contains(s, j.token) {
			return nil, fmt.Errorf("uses %s, which Go's regular expressions (RE2) do not support", j.what)
		}
	}
	if backref.MatchString(s) {
		return nil, errors.New("uses backreferences, which Go's regular expressions (RE2) do not support")
	}
	re, err := regexp.Compile(`^(?:` + s + `)$`)
	if err != nil {
		return nil, fmt.Errorf("is not a regular expression Go accepts: %v", strings.TrimPrefix(err.Error(), "error parsing regexp: "))
	}
	return re, nil
}
