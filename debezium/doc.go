// Package debezium converts a Debezium PostgreSQL connector configuration
// (Kafka Connect JSON or .properties) that uses the Outbox EventRouter into
// an outboxd configuration, for `outboxd debezium convert`.
//
// Parse reads the connector's settings; Convert maps them to outboxd's YAML
// and returns warnings for every setting outboxd cannot honour. Both are pure:
// they do no I/O and never return or print a password. Command is the
// subcommand's CLI around them.
//
// The caller's duties:
//  1. Show every Warning to the operator; the conversion is faithful only
//     where no warning says otherwise.
//  2. Supply the Postgres password outside the converted file (PGPASSWORD,
//     ~/.pgpass, postgres.password_file or OUTBOXD_POSTGRES_DSN); Convert
//     never copies it, nor resolves a config provider reference in it.
//  3. Supply the Kafka brokers (Options.Brokers): a connector configuration
//     does not name them, the Connect worker's does.
package debezium
