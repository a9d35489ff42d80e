package debezium

import (
	"strings"
	"testing"
)

// TestJavaRegex checks that compileJavaRegex refuses the Java constructs Go
// lacks or reads with another meaning, and compiles the others to match as
// Java's Matcher.matches() does.
func TestJavaRegex(t *testing.T) {
	for _, tc := range []struct {
		regex string
		err   string   // refused with an error containing this
		match []string // else: values it must match
		not   []string // and values it must not
	}{
		// Accepted by Go with another meaning: refused.
		{regex: `[a-z&&[^x]]+`, err: "rewrite the class without &&"},
		{regex: `[\w&&\D]+`, err: "intersection"},
		{regex: `[a-z[0-9]]+`, err: "nested class"},
		{regex: `[[:alpha:]]+`, err: "nested class"},
		{regex: `(?U)a+`, err: "inline flag U"},
		{regex: `(?iU:a+)`, err: "inline flag U"},
		{regex: `a\vb`, err: `\v`},
		{regex: `[\v]`, err: `\v`},
		{regex: `\0123`, err: "octal escape"},
		{regex: `(a)\12`, err: "backreferences"},
		// Lacking in Go: refused with a clear message.
		{regex: `a*+`, err: "possessive quantifier (*+)"},
		{regex: `a++`, err: "possessive"},
		{regex: `a?+`, err: "possessive"},
		{regex: `a{2}+`, err: "possessive quantifier ({2}+)"},
		{regex: `a{2,}+`, err: "possessive"},
		{regex: `(?>a+)b`, err: "atomic groups"},
		{regex: `(?=a).*`, err: "lookahead"},
		{regex: `(?!a).*`, err: "negative lookahead"},
		{regex: `(?<=a)b`, err: "lookbehind"},
		{regex: `(?<!a)b`, err: "negative lookbehind"},
		{regex: `\p{javaLowerCase}+`, err: `\p{java...}`},
		{regex: `[\Qa]\E]`, err: `\Q...\E inside a character class`},
		{regex: `(?x)a b`, err: "inline flag x"},
		{regex: `(a)\1`, err: "backreferences"},
		{regex: `(?<n>a)\k<n>`, err: "named backreferences"},
		{regex: `a\h`, err: `\h`},
		{regex: `\p{Lower}+`, err: "is not a regular expression Go accepts"},
		// Read alike: compiled and anchored.
		{regex: `\Qa.b\E`, match: []string{"a.b"}, not: []string{"axb"}},
		{regex: `\Q[a&&b]++\E+`, match: []string{"[a&&b]++", "[a&&b]+++"}},
		{regex: `\++`, match: []string{"+", "++"}, not: []string{""}},
		{regex: `[*+]+`, match: []string{"*+*"}},
		{regex: `[]a]+`, match: []string{"]a"}, not: []string{"b"}},
		{regex: `[^]a]+`, match: []string{"bc"}, not: []string{"a", "]"}},
		{regex: `[a-c&]+`, match: []string{"a&c"}},
		{regex: `a&&b|\[x&&y\]`, match: []string{"a&&b", "[x&&y]"}},
		{regex: `\x{41}+`, match: []string{"AA"}},
		{regex: `\\1`, match: []string{`\1`}},
		{regex: `(?i)ab`, match: []string{"AB"}},
		{regex: `(?<kind>[a-z]+)_v\d+`, match: []string{"order_v2"}, not: []string{"order_v2x", "xorder"}},
		{regex: `a{2}`, match: []string{"aa"}, not: []string{"a", "aaa"}},
		{regex: `\pL+`, match: []string{"ab"}},
		{regex: `a+?b`, match: []string{"aab"}},
	} {
		t.Run(tc.regex, func(t *testing.T) {
			re, err := compileJavaRegex(tc.regex)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q (Go regex %v)", err, tc.err, re)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range tc.match {
				if !re.MatchString(v) {
					t.Errorf("%s does not match %q; Java's does", re, v)
				}
			}
			for _, v := range tc.not {
				if re.MatchString(v) {
					t.Errorf("%s matches %q; Java's does not", re, v)
				}
			}
		})
	}
}
