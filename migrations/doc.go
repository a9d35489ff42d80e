// Package migrations ships the outbox table's DDL and applies it.
//
// The SQL files are written for public.outbox so that they can be read and
// applied by hand; Apply substitutes the configured table name.
package migrations
