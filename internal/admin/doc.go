// Package admin holds outboxd's one-shot commands that are not the relay:
// `outboxd migrate` (Migrate creates or completes the outbox table) and
// `outboxd status` (BuildReport reads the slot, the publication, the table
// and the running outboxd's /status; Report.WriteText prints it).
//
// Both open one regular connection of their own (package pg) and close it
// before returning; neither touches the replication slot's position.
// BuildReport fails on what it cannot read from Postgres, and records an
// unreachable outboxd process in the report instead of failing.
package admin
