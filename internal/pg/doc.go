// Package pg opens outboxd's connections to Postgres and reads the server
// state that more than one command needs.
//
// Every connection is built from config.Postgres the same way (ConnConfig):
// the DSN as libpq reads it, the password from postgres.password_file read
// at each connection (so a rotated secret is used by the next one), a
// per-host connect timeout, and TCP_USER_TIMEOUT on Linux. A failed
// connection is one error line that names the hosts and the user (never the
// password) and says what to check.
//
// The caller's duties:
//
//  1. Close every connection it opens (Connect, ConnectReplication, Lazy).
//  2. Use a connection from one goroutine at a time: pgx.Conn and
//     pgconn.PgConn are not safe for concurrent use, and Lazy is neither.
package pg
