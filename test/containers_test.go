package test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// startContainers starts Postgres 15 (wal_level=logical) and a single-node
// KRaft Kafka with testcontainers-go when a Docker engine answers. Without
// one it records why in svc.err.
func startContainers(ctx context.Context) (stop func()) {
	noop := func() {}
	if err := dockerAvailable(ctx); err != nil {
		svc.err = fmt.Errorf("OUTBOXD_TEST_PG_DSN and OUTBOXD_TEST_KAFKA_BROKERS are not set and no Docker engine answers (%v)", err)
		return noop
	}
	fmt.Fprintln(os.Stderr, "starting Postgres and Kafka with testcontainers-go")
	pg, err := tcpostgres.Run(ctx, "postgres:15",
		tcpostgres.WithDatabase("postgres"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		testcontainers.WithCmd("postgres", "-c", "wal_level=logical", "-c", "max_replication_slots=64", "-c", "max_wal_senders=64"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		svc.err = fmt.Errorf("starting the Postgres container: %w", err)
		return noop
	}
	kafka, err := tckafka.Run(ctx, "confluentinc/confluent-local:7.5.0", tckafka.WithClusterID("outboxd-test"))
	if err != nil {
		_ = testcontainers.TerminateContainer(pg)
		svc.err = fmt.Errorf("starting the Kafka container: %w", err)
		return noop
	}
	stop = func() {
		_ = testcontainers.TerminateContainer(kafka)
		_ = testcontainers.TerminateContainer(pg)
	}
	if svc.pgDSN, err = pg.ConnectionString(ctx, "sslmode=disable"); err == nil {
		svc.brokers, err = kafka.Brokers(ctx)
	}
	if err != nil {
		svc.err = fmt.Errorf("reading container addresses: %w", err)
	}
	return stop
}

func dockerAvailable(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil { // testcontainers panics on some Docker set-ups
			err = fmt.Errorf("docker check panicked: %v", r)
		}
	}()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.Health(ctx); err != nil {
		return errors.New("docker engine not reachable")
	}
	return nil
}
