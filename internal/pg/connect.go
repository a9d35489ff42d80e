package pg

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
)

// ConnConfig builds the settings of both the regular and the replication
// connection from pg: the DSN as libpq reads it (sslmode, sslrootcert,
// sslcert, sslkey, the PG* environment variables, ~/.pgpass), then the
// password from postgres.password_file, read now so that a rotated secret is
// used by the next connection.
func ConnConfig(pg config.Postgres) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(pg.DSN)
	if err != nil {
		return nil, fmt.Errorf("postgres.dsn is not a valid connection string%s; the value is not shown because it may hold a password", parseReason(err))
	}
	pw, err := pg.Password()
	if err != nil {
		return nil, err
	}
	if pw != "" {
		cfg.Password = pw
	}
	cfg.DialFunc = dialer().DialContext
	if cfg.ConnectTimeout == 0 {
		// Without connect_timeout pgconn gives every host the caller's one
		// deadline, and a host that accepts and never answers uses it up
		// before the next host is tried.
		cfg.ConnectTimeout = hostConnectTimeout
	}
	return cfg, nil
}

// hostConnectTimeout is each host's time to connect when postgres.dsn sets
// no connect_timeout.
var hostConnectTimeout = 5 * time.Second

// connectTimeout is the time to try every host of cfg: each its
// ConnectTimeout.
func connectTimeout(cfg *pgconn.Config) time.Duration {
	return cfg.ConnectTimeout * time.Duration(1+len(cfg.Fallbacks))
}

// parseReason returns the cause of a DSN parse failure without the DSN.
func parseReason(err error) string {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) && pe.Unwrap() != nil {
		return " (" + pe.Unwrap().Error() + ")"
	}
	return ""
}

// Connect opens a regular (non-replication) connection.
func Connect(ctx context.Context, pg config.Postgres) (*pgx.Conn, error) {
	return ConnectAt(ctx, pg, "")
}

// ConnectAt opens a regular connection, as Connect does, to the server at
// addr (Addr of a connection opened with the same postgres.dsn) only, or to
// any host of the DSN when addr is "". A run's catalogue reads use it: with
// two writable hosts in the DSN (an old primary back after a promotion), a
// read on the other one answers for a server the run does not stream from.
func ConnectAt(ctx context.Context, pg config.Postgres, addr string) (*pgx.Conn, error) {
	cfg, err := ConnConfig(pg)
	if err != nil {
		return nil, err
	}
	where := pinTo(&cfg.Config, addr)
	ctx, cancel := context.WithTimeout(ctx, connectTimeout(&cfg.Config))
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to Postgres at %s as %s: %w; %s",
			where, cfg.User, unwrapConnect(err), connectHint(err))
	}
	return conn, nil
}

// pinTo makes cfg dial addr only, unless it is "", and returns the hosts
// to name in an error.
func pinTo(cfg *pgconn.Config, addr string) string {
	where := hosts(cfg)
	if addr != "" {
		cfg.DialFunc = pinned(addr, cfg.DialFunc)
		_, at, _ := strings.Cut(addr, " ")
		where = at + " (of " + where + ", where the slot was read)"
	}
	return where
}

// ConnectReplication opens a logical replication connection
// (replication=database), named outboxd in pg_stat_replication.
func ConnectReplication(ctx context.Context, pg config.Postgres) (*pgconn.PgConn, error) {
	return connectReplication(ctx, pg, "")
}

// Addr is the address of the server c is connected to: "tcp 10.0.0.5:5432"
// or "unix /run/postgresql/.s.PGSQL.5432".
func Addr(c net.Conn) string {
	return c.RemoteAddr().Network() + " " + c.RemoteAddr().String()
}

// ConnectReplicationAt opens a logical replication connection, as
// ConnectReplication does, to the server at addr (Addr of a connection
// opened with the same postgres.dsn) only. With several hosts in the DSN
// and two of them writable (an old primary back after a promotion), the
// replication connection must land where the regular connection that read
// the slot did; the hosts are tried in the DSN's order, and every address
// but addr is passed over without dialling it.
func ConnectReplicationAt(ctx context.Context, pg config.Postgres, addr string) (*pgconn.PgConn, error) {
	return connectReplication(ctx, pg, addr)
}

// connectReplication is ConnectReplication, at addr only unless it is "".
func connectReplication(ctx context.Context, pg config.Postgres, addr string) (*pgconn.PgConn, error) {
	ccfg, err := ConnConfig(pg)
	if err != nil {
		return nil, err
	}
	cfg := &ccfg.Config
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "outboxd"
	where := pinTo(cfg, addr)
	ctx, cancel := context.WithTimeout(ctx, connectTimeout(cfg))
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening replication connection to %s as %s: %w; %s", where, cfg.User, unwrapConnect(err), connectHint(err))
	}
	return conn, nil
}

// errOtherServer refuses to dial a server other than the one pinned.
var errOtherServer = errors.New("not the server the slot was read on")

// pinned is dial for addr only (as Addr names it); every other address
// fails at once with errOtherServer.
func pinned(addr string, dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		if !sameAddr(network, address, addr) {
			return nil, fmt.Errorf("%s %s: %w", network, address, errOtherServer)
		}
		return dial(ctx, network, address)
	}
}

// sameAddr reports whether network and address, as pgconn dials them, name
// the server at addr (as Addr names it). A Unix socket's address is the
// path the server bound, which a DSN may reach through a symbolic link (a
// host of /var/run/postgresql, a link to /run/postgresql): paths are
// compared with their links resolved.
func sameAddr(network, address, addr string) bool {
	if network+" "+address == addr {
		return true
	}
	at, ok := strings.CutPrefix(addr, "unix ")
	if network != "unix" || !ok {
		return false
	}
	a, err := filepath.EvalSymlinks(address)
	if err != nil {
		return false
	}
	b, err := filepath.EvalSymlinks(at)
	return err == nil && a == b
}

// Lazy is a regular connection opened at its first use, and again after
// the server closed it. The zero value needs PG set. With Addr set it
// connects to that server only (ConnectAt).
type Lazy struct {
	PG   config.Postgres
	Addr string
	conn *pgx.Conn
}

// Get returns the open connection, connecting first if there is none or
// the server closed it.
func (l *Lazy) Get(ctx context.Context) (*pgx.Conn, error) {
	if l.conn == nil || l.conn.IsClosed() {
		conn, err := ConnectAt(ctx, l.PG, l.Addr)
		if err != nil {
			return nil, err
		}
		l.conn = conn
	}
	return l.conn, nil
}

// Close closes the connection, if one is open. Get opens a new one.
func (l *Lazy) Close() {
	if l.conn != nil {
		l.conn.Close(context.Background())
		l.conn = nil
	}
}

// hosts names every host:port of cfg, the DSN's first and its fallbacks
// (a DSN naming several hosts), once each.
func hosts(cfg *pgconn.Config) string {
	all := []string{net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))}
	for _, f := range cfg.Fallbacks {
		if h := net.JoinHostPort(f.Host, strconv.Itoa(int(f.Port))); !slices.Contains(all, h) {
			all = append(all, h)
		}
	}
	return strings.Join(all, ",")
}

// connectHint says what to check after a failed connection attempt.
func connectHint(err error) string {
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &unknownCA):
		return "the server's certificate is not signed by a CA in sslrootcert; set sslrootcert in postgres.dsn (or PGSSLROOTCERT) to the CA that signed it"
	case errors.As(err, &hostname):
		return "the server's certificate does not name the host in postgres.dsn; connect with a host name the certificate names, or fix the certificate's subjectAltName (sslmode=verify-full checks it)"
	case errors.As(err, &invalid):
		return "the server's certificate is not valid (expired or not for server use); renew it"
	case errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000"):
		return "check the user and password (postgres.dsn, postgres.password_file, PGPASSWORD or ~/.pgpass) and pg_hba.conf"
	}
	return "check postgres.dsn and that the server is running"
}

// unwrapConnect keeps the server's or the network's reason and drops pgconn's
// preamble, which repeats the host and user.
func unwrapConnect(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Unwrap() != nil {
		err = ce.Unwrap()
	}
	// pgconn lists every attempt's error, one a line: a host tried with and
	// without TLS (sslmode=prefer) failed the same way twice. Say each once.
	lines := strings.Split(err.Error(), "\n")
	if len(lines) == 1 {
		return err
	}
	seen := map[string]bool{}
	var uniq []string
	for _, l := range lines {
		if !seen[l] {
			seen[l] = true
			uniq = append(uniq, l)
		}
	}
	return &onceError{err: err, msg: strings.Join(uniq, "; ")}
}

// onceError is an error whose message says each of its lines once.
type onceError struct {
	err error
	msg string
}

func (e *onceError) Error() string { return e.msg }
func (e *onceError) Unwrap() error { return e.err }
