package relay

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/config"
)

// A host that refuses connections fails both of pgconn's attempts
// (sslmode=prefer tries TLS, then plain) the same way: the error says so once.
func TestConnectErrorSaysEachAttemptOnce(t *testing.T) {
	pg := config.Default().Postgres
	pg.DSN = "postgres://postgres@127.0.0.1:1/postgres" // nothing listens on port 1
	_, err := Connect(context.Background(), pg)
	if err == nil {
		t.Fatal("connecting to port 1: no error")
	}
	msg := err.Error()
	if n := strings.Count(msg, "connection refused"); n != 1 {
		t.Errorf("the error says %q %d times: %s", "connection refused", n, msg)
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("the error spans lines: %q", msg)
	}
}
