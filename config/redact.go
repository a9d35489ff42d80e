package config

import (
	"regexp"
	"strings"
)

var kvPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

const mask = "xxxxx"

// RedactDSN hides every password in a URL or key=value connection string
// (password, sslpassword). It splits a URL the way libpq does: the user
// information ends at the last '@' before the first '/', so a password may
// contain '#', '?' or ':'.
func RedactDSN(dsn string) string {
	scheme, rest, isURL := strings.Cut(dsn, "://")
	if !isURL {
		return kvPassword.ReplaceAllString(dsn, "${1}"+mask)
	}
	authority, path := rest, ""
	if i := strings.Index(rest, "/"); i >= 0 {
		authority, path = rest[:i], rest[i:]
	}
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		if user, _, hasPass := strings.Cut(authority[:at], ":"); hasPass {
			authority = user + ":" + mask + authority[at:]
		}
	}
	if base, query, ok := strings.Cut(path, "?"); ok {
		params := strings.Split(query, "&")
		for i, p := range params {
			if k, _, ok := strings.Cut(p, "="); ok && strings.Contains(strings.ToLower(k), "password") {
				params[i] = k + "=" + mask
			}
		}
		path = base + "?" + strings.Join(params, "&")
	}
	return scheme + "://" + authority + path
}
