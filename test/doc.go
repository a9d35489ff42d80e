// Package test holds outboxd's integration, fault and end-to-end suites. They
// run against a real PostgreSQL and a real Kafka, found through
// OUTBOXD_TEST_PG_DSN and OUTBOXD_TEST_KAFKA_BROKERS (scripts/testbed starts
// both; `make test` does it for you). With neither set and a Docker engine
// available, testcontainers-go starts them. With CI=true, a missing service
// fails the run with the reason; elsewhere the tests skip and say why.
//
// The suites build cmd/outboxd once and run it as a child process, so that
// they can signal and kill it like an operator or a crash would.
package test
