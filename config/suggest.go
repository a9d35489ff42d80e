package config

import (
	"reflect"
	"regexp"
	"strings"
)

// unknownField matches yaml.v3's message for a key that names no field.
var unknownField = regexp.MustCompile(`field (\S+) not found in type config\.(\w+)`)

// section is where a settings struct sits in the YAML, and its keys.
type section struct {
	path string
	keys []string
}

// sections maps each settings struct's Go type name to its place in the
// YAML (postgres, kafka.tls, ...).
func sections() map[string]section {
	out := map[string]section{}
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		s := section{path: path}
		for i := range t.NumField() {
			tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			s.keys = append(s.keys, tag)
			ft := t.Field(i).Type
			if ft.Kind() == reflect.Slice {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct && ft.PkgPath() == t.PkgPath() {
				walk(ft, join(path, tag))
			}
		}
		out[t.Name()] = s
	}
	walk(reflect.TypeOf(Config{}), "")
	return out
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// explainUnknown rewrites yaml.v3's "field x not found in type
// config.Postgres" as "unknown setting postgres.x", with the closest
// known key when one is close.
func explainUnknown(msg string) string {
	secs := sections()
	return unknownField.ReplaceAllStringFunc(msg, func(m string) string {
		sub := unknownField.FindStringSubmatch(m)
		sec := secs[sub[2]]
		out := "unknown setting " + join(sec.path, sub[1])
		if best := closest(sub[1], sec.keys); best != "" {
			out += " (did you mean " + join(sec.path, best) + "?)"
		}
		return out
	})
}

// closest returns the candidate nearest to s, if it is within two edits
// (or one for short names), else "".
func closest(s string, candidates []string) string {
	best, bestD := "", 3
	if len(s) <= 4 {
		bestD = 2
	}
	for _, c := range candidates {
		if d := distance(strings.ToLower(s), strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
