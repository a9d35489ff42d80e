package test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/sink"
)

// pki holds certificates made with openssl for one test: a CA, a server
// certificate for 127.0.0.1 only, a client certificate, and a second CA
// that signed nothing the servers use.
type pki struct {
	dir                   string
	ca, otherCA           string
	serverCert, serverKey string
	serverPEM             string // key then certificate, as Kafka's PEM keystore wants
	clientCert, clientKey string
}

// newPKI writes the certificates into a fresh directory that the postgres
// OS user can read; the server key belongs to that user when running as
// root, as Postgres requires.
func newPKI(t *testing.T, clientCN string) pki {
	t.Helper()
	requireTool(t, "openssl")
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// t.TempDir's parent is 0700 too; walk up and open what is ours.
	for d := filepath.Dir(dir); strings.HasPrefix(d, os.TempDir()) && d != os.TempDir(); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	p := pki{dir: dir}
	path := func(name string) string { return filepath.Join(dir, name) }
	openssl := func(args ...string) {
		t.Helper()
		out, err := exec.Command("openssl", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ec := []string{"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"}
	newCA := func(name string) string {
		openssl(append(append([]string{"req", "-x509"}, ec...), "-keyout", path(name+".key"), "-out", path(name+".crt"),
			"-days", "2", "-subj", "/CN=outboxd test "+name)...)
		return path(name + ".crt")
	}
	issue := func(name, cn, ext string) (string, string) {
		openssl(append(append([]string{"req"}, ec...), "-keyout", path(name+".key"), "-out", path(name+".csr"), "-subj", "/CN="+cn)...)
		if err := os.WriteFile(path(name+".ext"), []byte(ext+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		openssl("x509", "-req", "-in", path(name+".csr"), "-CA", path("ca.crt"), "-CAkey", path("ca.key"), "-CAcreateserial",
			"-out", path(name+".crt"), "-days", "2", "-extfile", path(name+".ext"))
		return path(name + ".crt"), path(name + ".key")
	}
	p.ca = newCA("ca")
	p.otherCA = newCA("other-ca")
	p.serverCert, p.serverKey = issue("server", "outboxd-test-server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
	p.clientCert, p.clientKey = issue("client", clientCN, "extendedKeyUsage=clientAuth")
	key, _ := os.ReadFile(p.serverKey)
	crt, _ := os.ReadFile(p.serverCert)
	p.serverPEM = path("server.pem")
	if err := os.WriteFile(p.serverPEM, append(key, crt...), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{p.ca, p.otherCA, p.serverCert, p.clientCert} {
		_ = os.Chmod(f, 0o644)
	}
	if os.Geteuid() == 0 {
		if u, err := user.Lookup("postgres"); err == nil {
			uid, _ := strconv.Atoi(u.Uid)
			gid, _ := strconv.Atoi(u.Gid)
			if err := os.Chown(p.serverKey, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	return p
}

// writeSecret writes a secret file, with a trailing newline as editors and
// Kubernetes secrets often leave.
func writeSecret(t *testing.T, name, secret string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(f, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// expectFatal runs outboxd with env and checks that it exits non-zero and
// that its final error (the one line at the top) matches want. It returns
// the whole output.
func expectFatal(t *testing.T, env []string, want string, args ...string) string {
	t.Helper()
	p := start(t, env, args...)
	code := p.waitExit(60 * time.Second)
	out := p.logs.String()
	if code == 0 {
		t.Fatalf("outboxd exited 0, want non-zero; log:\n%s", out)
	}
	var final string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.Contains(line, `msg="outboxd stopped"`) || strings.HasPrefix(line, "outboxd: ") {
			final = line
		}
	}
	if !regexp.MustCompile(want).MatchString(final) {
		t.Fatalf("final error %q does not match %q; log:\n%s", final, want, out)
	}
	t.Logf("exit %d: %s", code, final)
	return out
}

// with returns a copy of env with kvs added.
func with(env []string, kvs ...string) []string {
	return append(append([]string(nil), env...), kvs...)
}

func noSecret(t *testing.T, what, output string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(output, s) {
			t.Errorf("%s: output contains the secret %q:\n%s", what, s, output)
		}
	}
}

// tlsPostgres starts a scratch cluster with ssl=on, the server certificate
// of p and p's CA for client certificates.
func tlsPostgres(t *testing.T, p pki) (adminDSN string, port string) {
	t.Helper()
	adminDSN, _ = scratchCluster(t)
	port = regexp.MustCompile(`:(\d+)/`).FindStringSubmatch(adminDSN)[1]
	sqlOn(t, adminDSN,
		fmt.Sprintf(`ALTER SYSTEM SET ssl_cert_file = '%s'`, p.serverCert),
		fmt.Sprintf(`ALTER SYSTEM SET ssl_key_file = '%s'`, p.serverKey),
		fmt.Sprintf(`ALTER SYSTEM SET ssl_ca_file = '%s'`, p.ca),
		`ALTER SYSTEM SET ssl = on`,
		`SELECT pg_reload_conf()`)
	deadline := time.Now().Add(15 * time.Second)
	for {
		conn, err := pgx.Connect(context.Background(), strings.Replace(adminDSN, "sslmode=disable", "sslmode=require", 1))
		if err == nil {
			conn.Close(context.Background())
			return adminDSN, port
		}
		if time.Now().After(deadline) {
			t.Fatalf("Postgres did not accept TLS after ssl = on: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Postgres over TLS: every sslmode that verifies, with a client
// certificate and the password from a file; a wrong CA and a wrong host
// name are refused with a line that says what to fix; and outboxd streams
// end to end with sslmode=verify-full.
func TestPostgresTLS(t *testing.T) {
	t.Parallel()
	const role, password = "secapp", "tls-Pa55word"
	p := newPKI(t, role)
	admin, port := tlsPostgres(t, p)
	sqlOn(t, admin, fmt.Sprintf(`CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'`, role, password))
	conn, err := pgx.Connect(context.Background(), admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.Apply(context.Background(), conn, "public", "outbox"); err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())
	sqlOn(t, admin, `ALTER TABLE public.outbox OWNER TO `+role, `CREATE PUBLICATION outboxd FOR TABLE public.outbox`)

	pwFile := writeSecret(t, "pgpassword", password)
	wrongFile := writeSecret(t, "wrong", password+"-wrong")
	dsn := func(host, mode, ca string) string {
		s := fmt.Sprintf("host=%s port=%s user=%s dbname=postgres sslmode=%s sslcert=%s sslkey=%s", host, port, role, mode, p.clientCert, p.clientKey)
		if ca != "" {
			s += " sslrootcert=" + ca
		}
		return s
	}
	tests := []struct {
		name, dsn, passwordFile, wantErr string
	}{
		{"verify-full", dsn("127.0.0.1", "verify-full", p.ca), pwFile, ""},
		{"verify-ca ignores the host name", dsn("localhost", "verify-ca", p.ca), pwFile, ""},
		{"require", dsn("127.0.0.1", "require", ""), pwFile, ""},
		{"password in the DSN", dsn("127.0.0.1", "verify-full", p.ca) + " password=" + password, "", ""},
		{"password file overrides the DSN", dsn("127.0.0.1", "verify-full", p.ca) + " password=wrong", pwFile, ""},
		{"verify-full, wrong CA", dsn("127.0.0.1", "verify-full", p.otherCA), pwFile,
			`certificate signed by unknown authority.*; the server's certificate is not signed by a CA in sslrootcert`},
		{"verify-ca, wrong CA", dsn("127.0.0.1", "verify-ca", p.otherCA), pwFile,
			`certificate signed by unknown authority.*; the server's certificate is not signed by a CA in sslrootcert`},
		{"verify-full, wrong host name", dsn("localhost", "verify-full", p.ca), pwFile,
			`x509: certificate is not valid for any names, but wanted to match localhost; the server's certificate does not name the host in postgres\.dsn`},
		{"wrong password", dsn("127.0.0.1", "verify-full", p.ca), wrongFile,
			`password authentication failed for user "secapp".*; check the user and password \(postgres\.dsn, postgres\.password_file`},
		{"password file missing", dsn("127.0.0.1", "verify-full", p.ca), pwFile + ".missing",
			`^postgres\.password_file: cannot read the secret file: open .*pgpassword\.missing: no such file`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			conn, err := pg.Connect(ctx, config.Postgres{DSN: tt.dsn, PasswordFile: tt.passwordFile})
			if tt.wantErr != "" {
				if err == nil {
					conn.Close(ctx)
					t.Fatalf("connected, want an error matching %q", tt.wantErr)
				}
				if !regexp.MustCompile(tt.wantErr).MatchString(err.Error()) {
					t.Fatalf("error %q does not match %q", err, tt.wantErr)
				}
				noSecret(t, "error", err.Error(), password)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var ssl bool
			var clientDN *string
			if err := conn.QueryRow(ctx, `SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl, &clientDN); err != nil {
				t.Fatal(err)
			}
			if !ssl || clientDN == nil || *clientDN != "/CN="+role {
				t.Fatalf("ssl = %v, client_dn = %v; want TLS with the client certificate /CN=%s", ssl, clientDN, role)
			}
		})
	}

	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"OUTBOXD_POSTGRES_DSN=" + dsn("127.0.0.1", "verify-full", p.ca),
		"OUTBOXD_POSTGRES_PASSWORD_FILE=" + pwFile,
		"OUTBOXD_POSTGRES_SLOT=sectls", "OUTBOXD_POSTGRES_STATUS_INTERVAL=200ms",
		"OUTBOXD_KAFKA_BROKERS=" + strings.Join(svc.brokers, ","),
		"OUTBOXD_KAFKA_TOPIC_PARTITIONS=1", "OUTBOXD_KAFKA_TOPIC_REPLICATION_FACTOR=1",
		"OUTBOXD_HTTP_LISTEN=127.0.0.1:0",
	}
	t.Run("outboxd refuses a wrong CA", func(t *testing.T) {
		out := expectFatal(t, replace(env, "OUTBOXD_POSTGRES_DSN", dsn("127.0.0.1", "verify-full", p.otherCA)),
			`cannot connect to Postgres at 127\.0\.0\.1:\d+ as secapp: .*certificate signed by unknown authority.*set sslrootcert`)
		noSecret(t, "log", out, password)
	})
	t.Run("outboxd refuses a wrong host name", func(t *testing.T) {
		out := expectFatal(t, replace(env, "OUTBOXD_POSTGRES_DSN", dsn("localhost", "verify-full", p.ca)),
			`cannot connect to Postgres at localhost:\d+ as secapp: .*wanted to match localhost; the server's certificate does not name the host`)
		noSecret(t, "log", out, password)
	})
	t.Run("outboxd streams with verify-full", func(t *testing.T) {
		proc := start(t, env)
		proc.waitStreaming()
		topic := "sectls_" + randomSuffix()
		id := uuid()
		sqlOn(t, admin, fmt.Sprintf(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ('%s', '%s', 'k', 'Happened', '{}')`, id, topic))
		readUntil(t, []string{topic + "-events"}, time.Minute, 0, waitIDs(id))
		var sslConns int
		if err := pgxQueryRow(t, admin, `SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
			WHERE a.usename = 'secapp' AND s.ssl AND s.client_dn = '/CN=secapp'`, &sslConns); err != nil {
			t.Fatal(err)
		}
		if sslConns < 1 { // the replication connection at least (walsender)
			t.Errorf("%d TLS connections of secapp with its client certificate, want at least 1", sslConns)
		}
		proc.stop(syscall.SIGTERM, 30*time.Second)
		noSecret(t, "log", proc.logs.String(), password)
	})
}

func pgxQueryRow(t *testing.T, dsn, sql string, dest ...any) error {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dest...)
}

// The SASL_SSL Kafka's ports: listener for clients, controller, and the
// inter-broker PLAINTEXT listener (loopback only).
const (
	saslPort       = "29192"
	saslController = "29193"
	saslInternal   = "29194"
	saslUser       = "alice"
	saslPassword   = "alice-Scram-s3cret"
)

// saslKafka starts a Kafka broker with a SASL_SSL listener that accepts
// SCRAM-SHA-512, SCRAM-SHA-256 (users created at storage format time) and
// PLAIN for the user alice, with the server certificate of p. It is stopped
// at cleanup.
func saslKafka(t *testing.T, p pki) string {
	t.Helper()
	requireServices(t)
	dir, err := os.MkdirTemp("", "outboxd-sasl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	props := filepath.Join(dir, "sasl.properties")
	err = os.WriteFile(props, []byte(`listeners=SASL_SSL://127.0.0.1:`+saslPort+`,CONTROLLER://127.0.0.1:`+saslController+`,PLAINTEXT://127.0.0.1:`+saslInternal+`
advertised.listeners=SASL_SSL://127.0.0.1:`+saslPort+`,PLAINTEXT://127.0.0.1:`+saslInternal+`
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL
inter.broker.listener.name=PLAINTEXT
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_`+saslUser+`="`+saslPassword+`";
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=`+p.serverPEM+`
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(),
		"OUTBOXD_TESTBED_DIR="+dir,
		"OUTBOXD_TESTBED_KAFKA_PORT="+saslPort, // the port the script waits on
		"OUTBOXD_TESTBED_KAFKA_CONTROLLER_PORT="+saslController,
		"OUTBOXD_TESTBED_KAFKA_HEAP=-Xmx384m -Xms128m",
		"OUTBOXD_TESTBED_KAFKA_EXTRA_PROPERTIES="+props,
		"OUTBOXD_TESTBED_KAFKA_FORMAT_ARGS=--add-scram SCRAM-SHA-512=[name="+saslUser+",password="+saslPassword+"]"+
			" --add-scram SCRAM-SHA-256=[name="+saslUser+",password="+saslPassword+"]",
	)
	run := func(script string, args ...string) {
		t.Helper()
		cmd := exec.Command("../scripts/testbed/"+script, args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
	}
	t.Cleanup(func() { run("kafka-stop", "--purge") })
	run("kafka-start")
	return "127.0.0.1:" + saslPort
}

// saslClientOpts are a test client's settings for the SASL_SSL broker.
func saslClientOpts(t *testing.T, p pki) []kgo.Opt {
	t.Helper()
	pem, err := os.ReadFile(p.ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return []kgo.Opt{
		kgo.DialTLSConfig(&tls.Config{RootCAs: pool}),
		kgo.SASL(scram.Auth{User: saslUser, Pass: saslPassword}.AsSha512Mechanism()),
	}
}

// Kafka over SASL_SSL with SCRAM-SHA-512: outboxd delivers with the
// password from a file; bad credentials and a wrong CA stop it at start-up
// with a line that says what to fix; the password never shows.
func TestKafkaSASLSSL(t *testing.T) {
	t.Parallel()
	p := newPKI(t, "unused")
	broker := saslKafka(t, p)
	d := newDB(t)
	pwFile := writeSecret(t, "kafka-password", saslPassword)
	env := replace(d.env(
		"OUTBOXD_KAFKA_TLS_ENABLED=true",
		"OUTBOXD_KAFKA_TLS_CA_FILE="+p.ca,
		"OUTBOXD_KAFKA_SASL_MECHANISM=SCRAM-SHA-512",
		"OUTBOXD_KAFKA_SASL_USERNAME="+saslUser,
	), "OUTBOXD_KAFKA_BROKERS", broker)
	withFile := with(env, "OUTBOXD_KAFKA_SASL_PASSWORD_FILE="+pwFile)
	withEnv := with(env, "OUTBOXD_KAFKA_SASL_PASSWORD="+saslPassword)

	t.Run("check-config hides the password", func(t *testing.T) {
		cmd := exec.Command(svc.bin, "-check-config")
		cmd.Env = withEnv
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		noSecret(t, "check-config", string(out), saslPassword)
		if !strings.Contains(string(out), "password: xxxxx") {
			t.Errorf("check-config does not show the password as masked:\n%s", out)
		}
	})
	t.Run("bad credentials", func(t *testing.T) {
		const wrong = "not-alices-password"
		out := expectFatal(t, with(env, "OUTBOXD_KAFKA_SASL_PASSWORD="+wrong),
			`the Kafka brokers 127\.0\.0\.1:`+saslPort+` rejected the SASL credentials for user alice \(SCRAM-SHA-512\): .*invalid credentials.*; check kafka\.sasl\.username and kafka\.sasl\.password`)
		noSecret(t, "log", out, wrong, saslPassword)
	})
	t.Run("unknown user", func(t *testing.T) {
		out := expectFatal(t, replace(withEnv, "OUTBOXD_KAFKA_SASL_USERNAME", "mallory"),
			`rejected the SASL credentials for user mallory \(SCRAM-SHA-512\)`)
		noSecret(t, "log", out, saslPassword)
	})
	t.Run("wrong CA", func(t *testing.T) {
		out := expectFatal(t, replace(withFile, "OUTBOXD_KAFKA_TLS_CA_FILE", p.otherCA),
			`cannot reach Kafka brokers 127\.0\.0\.1:`+saslPort+`: .*certificate signed by unknown authority; their certificate is not signed by a CA in kafka\.tls\.ca_file`)
		noSecret(t, "log", out, saslPassword)
	})
	t.Run("every mechanism", func(t *testing.T) {
		for _, mech := range []string{config.MechanismPlain, config.MechanismScramSHA256, config.MechanismScramSHA512} {
			for _, pw := range []string{saslPassword, "wrong"} {
				kc := config.Default().Kafka
				kc.Brokers = []string{broker}
				kc.TLS = config.TLS{Enabled: true, CAFile: p.ca}
				kc.SASL = config.SASL{Mechanism: mech, Username: saslUser, Password: pw}
				prod, err := sink.New(kc, sink.NewMetrics(prometheus.NewRegistry()), slog.New(slog.NewTextHandler(io.Discard, nil)))
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				err = prod.Ping(ctx)
				cancel()
				prod.Close()
				switch {
				case pw == saslPassword && err != nil:
					t.Errorf("%s: %v", mech, err)
				case pw != saslPassword && !errors.Is(err, kerr.SaslAuthenticationFailed):
					t.Errorf("%s with a wrong password: got %v, want SASL_AUTHENTICATION_FAILED", mech, err)
				}
			}
		}
	})
	t.Run("streams with the password from a file", func(t *testing.T) {
		proc := start(t, withFile)
		proc.waitStreaming()
		topic := d.name + "_sasl"
		id, _ := insertEvent(t, d, topic, "k", `{}`)
		waitRecord(t, append(saslClientOpts(t, p), kgo.SeedBrokers(broker)), topic+"-events", id, time.Minute)
		_, metrics := proc.get("/metrics")
		_, status := proc.get("/status")
		proc.stop(syscall.SIGTERM, 30*time.Second)
		noSecret(t, "log", proc.logs.String(), saslPassword)
		noSecret(t, "/metrics", metrics, saslPassword)
		noSecret(t, "/status", status, saslPassword)
	})
}

// waitRecord consumes topic with a client built from opts until a record
// with the id header arrives.
func waitRecord(t *testing.T, opts []kgo.Opt, topic, id string, timeout time.Duration) {
	t.Helper()
	cl, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond), kgo.MetadataMinAge(250*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		for _, r := range fs.Records() {
			if header(r, "id") == id {
				return
			}
		}
	}
	t.Fatalf("no record with id %s on %s within %s", id, topic, timeout)
}

// The least-privilege role of migrations/roles/least_privilege.sql streams
// end to end; without SELECT on the outbox table outboxd names the missing
// grant.
func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	requireTool(t, "psql")
	d := newDB(t)
	role := "lp_" + randomSuffix()
	const password = "Least-Pr1v-pw"
	t.Cleanup(func() {
		_, _ = d.pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %s; DROP ROLE IF EXISTS %s`, role, role))
	})
	psql := exec.Command("psql", d.dsn, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "role="+role, "-v", "password="+password,
		"-v", "table=public.outbox", "-v", "schema=public", "-v", "publication=outboxd", "-f", "../migrations/roles/least_privilege.sql")
	if out, err := psql.CombinedOutput(); err != nil {
		t.Fatalf("psql -f migrations/roles/least_privilege.sql: %v\n%s", err, out)
	}
	var super, createDB, createRole, replication bool
	if err := d.pool.QueryRow(context.Background(), `SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication FROM pg_roles WHERE rolname = $1`, role).
		Scan(&super, &createDB, &createRole, &replication); err != nil {
		t.Fatal(err)
	}
	if super || createDB || createRole || !replication {
		t.Fatalf("role %s: superuser %v, createdb %v, createrole %v, replication %v", role, super, createDB, createRole, replication)
	}
	if ins, upd, del, trunc := publishes(t, d, "outboxd"); !ins || !upd || del || trunc {
		t.Errorf("the script's publication publishes insert=%v update=%v delete=%v truncate=%v, want what outboxd creates: inserts and updates", ins, upd, del, trunc)
	}
	var viaRoot bool
	if err := d.pool.QueryRow(context.Background(), `SELECT pubviaroot FROM pg_publication WHERE pubname = 'outboxd'`).Scan(&viaRoot); err != nil || !viaRoot {
		t.Errorf("the script's publication: publish_via_partition_root = %v (%v), want true, as outboxd creates it", viaRoot, err)
	}
	dsn := strings.Replace(d.dsn, "postgres://postgres@", fmt.Sprintf("postgres://%s:%s@", role, password), 1)
	env := replace(replace(d.env(), "OUTBOXD_POSTGRES_DSN", dsn), "OUTBOXD_POSTGRES_CREATE_PUBLICATION", "false")

	t.Run("without SELECT", func(t *testing.T) {
		d.exec(t, `REVOKE SELECT ON public.outbox FROM `+role)
		defer d.exec(t, `GRANT SELECT ON public.outbox TO `+role)
		expectStartupError(t, env, `role `+role+` lacks SELECT on the outbox table public\.outbox; run GRANT SELECT ON \\?"public\\?"\.\\?"outbox\\?" TO \\?"`+role+`\\?"`)
	})
	t.Run("streams", func(t *testing.T) {
		proc := start(t, env)
		proc.waitStreaming()
		id, _ := insertEvent(t, d, d.name+"_lp", "k", `{}`)
		readUntil(t, []string{d.name + "_lp-events"}, time.Minute, 0, waitIDs(id))
		status := exec.Command(svc.bin, "status", "-url", "http://"+proc.addr)
		status.Env = env
		out, err := status.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "active, held by pid") {
			t.Errorf("outboxd status as %s: %v\n%s", role, err, out)
		}
		noSecret(t, "status", string(out), password)
		proc.stop(syscall.SIGTERM, 30*time.Second)
		noSecret(t, "log", proc.logs.String(), password)
	})
}

// On Amazon RDS and Aurora no one can give REPLICATION; membership of the
// role rds_replication stands for it. The least-privilege script grants the
// membership where that role exists, and outboxd's start-up check accepts
// it: here, on a Postgres without RDS' change, it is Postgres itself that
// then refuses the slot. Not parallel: while rds_replication exists, the
// script takes this branch for every role.
func TestLeastPrivilegeRoleOnRDS(t *testing.T) {
	requireTool(t, "psql")
	d := newDB(t)
	role := "lprds_" + randomSuffix()
	const password = "Least-Pr1v-rds"
	d.exec(t, `CREATE ROLE rds_replication NOLOGIN`)
	t.Cleanup(func() {
		_, _ = d.pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %s; DROP ROLE IF EXISTS %s; DROP ROLE IF EXISTS rds_replication`, role, role))
	})
	psql := exec.Command("psql", d.dsn, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "role="+role, "-v", "password="+password,
		"-v", "table=public.outbox", "-v", "schema=public", "-v", "publication=outboxd", "-f", "../migrations/roles/least_privilege.sql")
	if out, err := psql.CombinedOutput(); err != nil {
		t.Fatalf("psql -f migrations/roles/least_privilege.sql: %v\n%s", err, out)
	}
	var replication, member bool
	if err := d.pool.QueryRow(context.Background(), `SELECT rolreplication, pg_has_role(rolname, 'rds_replication', 'MEMBER') FROM pg_roles WHERE rolname = $1`, role).
		Scan(&replication, &member); err != nil {
		t.Fatal(err)
	}
	if replication || !member {
		t.Fatalf("role %s: REPLICATION %v, member of rds_replication %v; want the membership instead of the attribute", role, replication, member)
	}
	dsn := strings.Replace(d.dsn, "postgres://postgres@", fmt.Sprintf("postgres://%s:%s@", role, password), 1)
	env := replace(replace(d.env(), "OUTBOXD_POSTGRES_DSN", dsn), "OUTBOXD_POSTGRES_CREATE_PUBLICATION", "false")
	// Postgres 16 reworded the refusal.
	expectStartupError(t, env, `must be superuser or replication role|permission denied to use replication slots`)
}
