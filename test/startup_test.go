package test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// expectStartupError runs outboxd with env and args and checks that it
// exits non-zero with one error line matching want.
func expectStartupError(t *testing.T, env []string, want string, args ...string) {
	t.Helper()
	p := start(t, env, args...)
	code := p.waitExit(60 * time.Second)
	if code == 0 {
		t.Fatalf("outboxd exited 0, want non-zero; log:\n%s", p.logs.String())
	}
	var errLines []string
	for _, line := range strings.Split(strings.TrimSpace(p.logs.String()), "\n") {
		if strings.Contains(line, "level=ERROR") || strings.HasPrefix(line, "outboxd: ") {
			errLines = append(errLines, line)
		}
	}
	if len(errLines) != 1 {
		t.Fatalf("want exactly one error line, got %d; log:\n%s", len(errLines), p.logs.String())
	}
	if !regexp.MustCompile(want).MatchString(errLines[0]) {
		t.Fatalf("error line %q does not match %q", errLines[0], want)
	}
	t.Logf("exit %d: %s", code, errLines[0])
}

// replace returns env with the variable name set to value.
func replace(env []string, name, value string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return append(out, name+"="+value)
}

// Acceptance 5: each start-up error is one clear line and a non-zero exit.
func TestStartupErrors(t *testing.T) {
	d := newDB(t)
	t.Run("postgres unreachable", func(t *testing.T) {
		expectStartupError(t, replace(d.env(), "OUTBOXD_POSTGRES_DSN", "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable"),
			`cannot connect to Postgres at 127\.0\.0\.1:1 as postgres: .*connection refused.*check postgres\.dsn`)
	})
	t.Run("role lacks REPLICATION", func(t *testing.T) {
		role := "norepl_" + randomSuffix()
		d.exec(t, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'pw-%s'`, role, role))
		t.Cleanup(func() { _, _ = d.pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
		dsn := strings.Replace(d.dsn, "postgres://postgres@", fmt.Sprintf("postgres://%s:pw-%s@", role, role), 1)
		expectStartupError(t, replace(d.env(), "OUTBOXD_POSTGRES_DSN", dsn),
			`role `+role+` lacks the REPLICATION attribute; run ALTER ROLE `)
	})
	t.Run("outbox table missing", func(t *testing.T) {
		expectStartupError(t, replace(d.env(), "OUTBOXD_POSTGRES_TABLE", "public.no_such_outbox"),
			`outbox table public\.no_such_outbox does not exist; run 'outboxd migrate'`)
	})
	t.Run("outbox column missing", func(t *testing.T) {
		expectStartupError(t, replace(d.env(), "OUTBOXD_ROUTER_KEY_COLUMN", "aggregateid"),
			`outbox table public\.outbox has no column aggregateid`)
	})
	t.Run("key column type that key_encoding json refuses", func(t *testing.T) {
		expectStartupError(t, append(d.env(), "OUTBOXD_ROUTER_KEY_ENCODING=json", "OUTBOXD_ROUTER_KEY_COLUMN=created_at"),
			`outbox table public\.outbox: key column created_at is timestamptz, .*use a text, uuid or integer key column, or key_encoding raw`)
	})
	t.Run("key column with a default under key_encoding json_schema", func(t *testing.T) {
		// A uuid DEFAULT gen_random_uuid() is written as Debezium's schema
		// writes it (issue 33 item 7); a domain's is refused.
		d.exec(t, `CREATE DOMAIN outbox_key AS uuid`)
		d.exec(t, `ALTER TABLE public.outbox ADD COLUMN dkey outbox_key DEFAULT gen_random_uuid()`)
		expectStartupError(t, append(d.env(), "OUTBOXD_ROUTER_KEY_ENCODING=json_schema", "OUTBOXD_ROUTER_KEY_COLUMN=dkey"),
			`outbox table public\.outbox: key column dkey has a DEFAULT, .*its type is a domain.* drop the default or use key_encoding json or raw`)
	})
	t.Run("headers column not json", func(t *testing.T) {
		expectStartupError(t, append(d.env(), "OUTBOXD_ROUTER_HEADERS_COLUMN=event_type"),
			`column event_type \(router\.headers_column\) must be of type json or jsonb`)
	})
	t.Run("kafka unreachable", func(t *testing.T) {
		expectStartupError(t, replace(d.env(), "OUTBOXD_KAFKA_BROKERS", "127.0.0.1:1"),
			`cannot reach Kafka brokers 127\.0\.0\.1:1: .*check kafka\.brokers`)
	})
	t.Run("endpoints answer during a slow check", func(t *testing.T) {
		// A "broker" that accepts connections and never answers keeps the
		// start-up check waiting; meanwhile the endpoints say alive, not
		// ready, and why.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
		p := start(t, replace(d.env(), "OUTBOXD_KAFKA_BROKERS", ln.Addr().String()))
		defer p.kill()
		p.addr = listenRE.FindStringSubmatch(p.waitLog(`msg="serving metrics and health" addr=\S+`, 30*time.Second))[1]
		if code, body := p.get("/healthz"); code != 200 {
			t.Errorf("/healthz during the start-up check: %d %s, want 200", code, body)
		}
		if code, body := p.get("/readyz"); code != 503 || !strings.Contains(body, `"state":"starting"`) {
			t.Errorf("/readyz during the start-up check: %d %s, want 503 with state starting", code, body)
		}
		if _, body := p.get("/metrics"); !strings.Contains(body, `outboxd_relay_state{state="starting"} 1`) {
			t.Errorf("/metrics during the start-up check has no starting state:\n%.2000s", body)
		}
	})
	t.Run("invalid configuration", func(t *testing.T) {
		expectStartupError(t, append(d.env(), "OUTBOXD_POSTGRES_SLOTT=x"),
			`environment variable OUTBOXD_POSTGRES_SLOTT names no setting`)
	})
	t.Run("publication missing and not to be created", func(t *testing.T) {
		env := replace(d.env(), "OUTBOXD_POSTGRES_CREATE_PUBLICATION", "false")
		expectStartupError(t, replace(env, "OUTBOXD_POSTGRES_PUBLICATION", "nopub"),
			`publication \\?"nopub\\?" does not exist; create it with CREATE PUBLICATION \\?"nopub\\?" FOR TABLE \\?"public\\?"\.\\?"outbox\\?" WITH \(publish = 'insert, update', publish_via_partition_root = true\)`)
	})
}

// scratchCluster starts a second Postgres with the test bed script, on its
// own port and directory, and returns its DSN and a function to run SQL.
func scratchCluster(t *testing.T) (dsn string, restart func()) {
	t.Helper()
	requireServices(t)
	dir, err := os.MkdirTemp("", "outboxd-scratch-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o755) // the postgres user must reach it
	t.Cleanup(func() { os.RemoveAll(dir) })
	// A port the kernel just handed out and nothing holds: a fixed range
	// can collide with the local end of an outgoing connection (55696 did).
	port := fmt.Sprint(freePort(t))
	env := append(os.Environ(), "OUTBOXD_TESTBED_DIR="+dir, "OUTBOXD_TESTBED_PG_PORT="+port)
	run := func(script string) {
		t.Helper()
		cmd := exec.Command("../scripts/testbed/" + script)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
	}
	run("pg-start")
	t.Cleanup(func() { run("pg-stop") })
	return "postgres://postgres@127.0.0.1:" + port + "/postgres?sslmode=disable", func() { run("pg-stop"); run("pg-start") }
}

func sqlOn(t *testing.T, dsn string, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// Acceptance 5, continued: wal_level and an invalidated slot need a cluster
// whose settings the test can change.
func TestStartupErrorsOnMisconfiguredServer(t *testing.T) {
	dsn, restart := scratchCluster(t)
	sqlOn(t, dsn, `ALTER SYSTEM SET wal_level = replica`)
	restart()
	sqlOn(t, dsn, `CREATE TABLE public.outbox (id uuid PRIMARY KEY, aggregate_type text, aggregate_id text, event_type text, payload jsonb)`)
	env := []string{
		"PATH=" + os.Getenv("PATH"), "OUTBOXD_POSTGRES_DSN=" + dsn, "OUTBOXD_POSTGRES_SLOT=scratch",
		"OUTBOXD_KAFKA_BROKERS=" + strings.Join(svc.brokers, ","), "OUTBOXD_HTTP_LISTEN=",
	}
	t.Run("wal_level not logical", func(t *testing.T) {
		expectStartupError(t, env, `wal_level is replica; set wal_level = logical in postgresql\.conf .*restart Postgres`)
	})

	sqlOn(t, dsn, `ALTER SYSTEM SET wal_level = logical`, `ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`)
	restart()
	sqlOn(t, dsn,
		`SELECT pg_create_logical_replication_slot('scratch', 'pgoutput')`,
		`CREATE TABLE filler AS SELECT repeat('x', 1000) AS v FROM generate_series(1, 40000)`,
		`SELECT pg_switch_wal()`, `CHECKPOINT`,
		`INSERT INTO filler SELECT repeat('y', 1000) FROM generate_series(1, 40000)`,
		`SELECT pg_switch_wal()`, `CHECKPOINT`)
	var status string
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(context.Background(), `SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'scratch'`).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "lost" {
		t.Fatalf("could not invalidate the slot for the test: wal_status = %s", status)
	}
	t.Run("slot invalidated", func(t *testing.T) {
		expectStartupError(t, env, `replication slot \\?"scratch\\?" is invalidated: Postgres removed WAL it still needed .*may never be delivered`)
	})
}

// A slot held by another process: outboxd says so, keeps retrying, and
// streams once the slot is free.
func TestSlotHeldByAnotherProcessIsWaitedFor(t *testing.T) {
	d := newDB(t)
	d.exec(t, `CREATE PUBLICATION outboxd FOR TABLE public.outbox`)
	d.exec(t, fmt.Sprintf(`SELECT pg_create_logical_replication_slot('%s', 'pgoutput')`, d.slot))
	ctx := context.Background()
	holder := d.replicationConn(t)
	err := pglogrepl.StartReplication(ctx, holder, d.slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'outboxd'"}})
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, d.env("OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=100ms", "OUTBOXD_LOG_LEVEL=debug"))
	p.waitLog(`replication slot \\?"`+d.slot+`\\?" is in use by process \d+`, 30*time.Second)
	p.waitLog(`msg="standby: another process holds the slot`, 30*time.Second)
	// A standby polls with an ordinary connection only: a replication
	// connection per poll would take a walsender place from the holder.
	const opening = `msg="opening a replication connection"`
	opened := strings.Count(p.logs.String(), opening)
	time.Sleep(time.Second) // ten polls
	if n := strings.Count(p.logs.String(), opening) - opened; n > 0 {
		t.Fatalf("outboxd opened %d replication connections in standby, while another process held the slot", n)
	}
	holder.Close(ctx)
	p.waitLog(`msg=streaming`, 60*time.Second)
	if n := strings.Count(p.logs.String(), opening) - opened; n != 1 {
		t.Errorf("outboxd opened %d replication connections to take over the slot, want 1", n)
	}
}
