// Package config defines outboxd's configuration: one Config struct, filled
// from defaults, then a YAML file decoded strictly (an unknown key is an
// error), then OUTBOXD_* environment variables, and checked by Validate, whose
// errors name the offending field.
//
// Environment variable names are OUTBOXD_ followed by the YAML path in upper
// case joined by underscores: postgres.dsn is OUTBOXD_POSTGRES_DSN,
// kafka.brokers is OUTBOXD_KAFKA_BROKERS (comma-separated). An OUTBOXD_*
// variable that names no field is an error, except the OUTBOXD_TEST* names
// reserved for the test bed.
//
// A setting with a fixed set of values (router.on_update, router.poison.policy,
// router.key_encoding, kafka.delivery, ...) is a string type with a constant
// per value, such as OnUpdate and OnUpdateWarn; files and variables set it as
// a plain string, and Validate checks every such setting in one place.
//
// Secrets: the Postgres DSN may carry passwords, and kafka.sasl.password is
// one; postgres.password_file and kafka.sasl.password_file name files that
// hold one (read by Postgres.Password and SASL.Secret, at every connection).
// Redacted returns a copy safe to print; errors from this package never
// include the DSN or a secret, and name secret files without their content.
// TLS.Config builds the Kafka TLS client configuration from its files.
package config
