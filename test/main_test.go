package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// services are the real Postgres and Kafka the suites talk to.
type services struct {
	pgDSN   string
	brokers []string
	err     error  // why the services are not available
	bin     string // the outboxd binary under test
}

var svc services

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "outboxd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	svc.bin = filepath.Join(dir, "outboxd")
	build := exec.Command("go", "build", "-o", svc.bin, "../cmd/outboxd")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building outboxd:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stop := findServices(ctx)
	defer stop()
	return m.Run()
}

// findServices fills svc from the environment, or starts containers.
func findServices(ctx context.Context) (stop func()) {
	svc.pgDSN = os.Getenv("OUTBOXD_TEST_PG_DSN")
	if b := os.Getenv("OUTBOXD_TEST_KAFKA_BROKERS"); b != "" {
		svc.brokers = strings.Split(b, ",")
	}
	if svc.pgDSN != "" && len(svc.brokers) > 0 {
		return func() {}
	}
	if svc.pgDSN != "" || len(svc.brokers) > 0 {
		svc.err = fmt.Errorf("set both OUTBOXD_TEST_PG_DSN and OUTBOXD_TEST_KAFKA_BROKERS, or neither (got only one)")
		return func() {}
	}
	return startContainers(ctx)
}

// requireServices skips (or, in CI, fails) a test that has no services.
func requireServices(t *testing.T) {
	t.Helper()
	if svc.err == nil {
		return
	}
	skipOrFail(t, fmt.Sprintf("integration services unavailable: %v. Run 'make test', or start them with scripts/testbed/pg-start and scripts/testbed/kafka-start and source $OUTBOXD_TESTBED_DIR/env", svc.err))
}

// requireTool skips (or, in CI, fails) a test that needs a command the
// machine does not have.
func requireTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err == nil {
		return
	}
	skipOrFail(t, fmt.Sprintf("%s is not installed (Debian: openssl, postgresql-client-15)", name))
}

// skipOrFail skips the test, or fails it in CI, where nothing may skip.
func skipOrFail(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
