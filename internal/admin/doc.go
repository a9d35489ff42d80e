// Package admin holds outboxd's one-shot commands that are not the relay:
// `outboxd migrate` (Migrate creates or completes the outbox table) and
// `outboxd status` (BuildReport reads the slot, the publication, the table
// and the running outboxd's /status; Report.WriteText prints it). With
// postgres.shards above 1 the report lists every shard's slot, the worst
// (a missing slot, then the greatest lag) first, and its slot fields are
// the worst shard's.
//
// Both open one regular connection of their own (package pg) and close it
// before returning; neither touches the replication slot's position.
// BuildReport fails on what it cannot read from Postgres, and records an
// unreachable outboxd process in the report instead of failing.
package admin
