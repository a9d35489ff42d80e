package reshard

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// The reshard steps that ask the server (the shard filter check, creating
// and fixing a shard publication) retry what a retry can clear and stop on
// what is the statement's own fault, by SQLSTATE (review of issue 32,
// reshard finding 8a: every SQLSTATE was permanent, so a cancel, a
// shutdown or a deadlock during a reshard stopped outboxd for good).
func TestTransientBySQLSTATE(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{errors.New("connection reset by peer"), true},
		{context.DeadlineExceeded, true},
		{&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, true},
		{&pgconn.PgError{Code: "57014", Message: "Abbruch der Anfrage wegen Benutzeranforderung"}, true},
		{&pgconn.PgError{Code: "40P01", Message: "deadlock detected"}, true},
		{&pgconn.PgError{Code: "40001"}, true},
		{&pgconn.PgError{Code: "53300", Message: "too many connections"}, true},
		{&pgconn.PgError{Code: "55P03", Message: "lock not available"}, true},
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "42703", Message: "column does not exist"}, false},
		{&pgconn.PgError{Code: "42883", Message: "function does not exist"}, false},
		{&pgconn.PgError{Code: "42501", Message: "permission denied"}, false},
		{&pgconn.PgError{Code: "22P02"}, false},
		{&pgconn.PgError{Code: "0A000"}, false},
		{&pgconn.PgError{Code: "55000", Message: "object not in prerequisite state"}, false},
		{fmt.Errorf("checking: %w", &pgconn.PgError{Code: "57P01"}), true},
		{&pgconn.PgError{Code: "57P04", Message: "database dropped"}, false},
		{&pgconn.PgError{Code: "53400", Message: "configuration limit exceeded"}, false},
		{&pgconn.PgError{Code: "08P01", Message: "protocol violation"}, false},
	} {
		if got := transient(c.err); got != c.want {
			t.Errorf("transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
