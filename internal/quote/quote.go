// Package quote quotes names and values for SQL text sent to Postgres, for
// the statements that cannot take parameters (DDL, replication commands).
package quote

import "strings"

// Ident quotes s as a Postgres identifier: "a""b".
func Ident(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// Literal quotes s as an SQL string literal (a quote is doubled), as Postgres reads it
// with standard_conforming_strings on (the default since 9.1).
func Literal(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }
