package pg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/dialtest"
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

func TestHosts(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://u@db:5433/app", "db:5433"},
		{"postgres://u@a:1,b:2/app?target_session_attrs=read-write", "a:1,b:2"},
		{"host=a,b port=5432 user=u target_session_attrs=read-write", "a:5432,b:5432"},
		{"postgres://u@[::1]:5432/app", "[::1]:5432"},
	} {
		cfg, err := pgconn.ParseConfig(tc.dsn)
		if err != nil {
			t.Fatal(err)
		}
		if got := hosts(cfg); got != tc.want {
			t.Errorf("hosts(%s) = %s, want %s", tc.dsn, got, tc.want)
		}
	}
}

// TestConnectTriesEveryHost: a first host that accepts and never answers
// (a tarpit) does not keep the second from being tried, when the DSN sets
// no connect_timeout.
func TestConnectTriesEveryHost(t *testing.T) {
	defer func(d time.Duration) { hostConnectTimeout = d }(hostConnectTimeout)
	hostConnectTimeout = time.Second
	tarpit, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tarpit.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := tarpit.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}()
	second, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	reached := make(chan struct{}, 16)
	go func() {
		for {
			c, err := second.Accept()
			if err != nil {
				return
			}
			reached <- struct{}{}
			c.Close() // answers by hanging up: a failed attempt, but an attempt
		}
	}()
	dsn := fmt.Sprintf("postgres://u@%s,%s/app?sslmode=disable", tarpit.Addr(), second.Addr())
	pgc := config.Postgres{DSN: dsn, Slot: "outboxd"}
	for name, connect := range map[string]func(context.Context) error{
		"regular": func(ctx context.Context) error {
			_, err := Connect(ctx, pgc)
			return err
		},
		"replication": func(ctx context.Context) error {
			_, err := ConnectReplication(ctx, pgc)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			for len(reached) > 0 {
				<-reached
			}
			err := connect(context.Background())
			if err == nil {
				t.Fatal("connected")
			}
			select {
			case <-reached:
			default:
				t.Fatalf("the second host was never tried: %v", err)
			}
			if want := tarpit.Addr().String() + "," + second.Addr().String(); !strings.Contains(err.Error(), want) {
				t.Errorf("%v does not name %s", err, want)
			}
		})
	}
}

// TestReplicationConnectionPinned: with two hosts in the DSN, the
// replication connection pinned to the second (where the regular
// connection read the slot) never dials the first, even when the first
// accepts (an old primary back after a promotion; issue 32 item 9).
func TestReplicationConnectionPinned(t *testing.T) {
	defer func(d time.Duration) { hostConnectTimeout = d }(hostConnectTimeout)
	hostConnectTimeout = time.Second
	first, second := dialtest.Listen(t, "tcp", "127.0.0.1:0"), dialtest.Listen(t, "tcp", "127.0.0.1:0") // not Postgres: attempts fail after the dial
	addrs := [2]string{first.Addr(), second.Addr()}
	pg := config.Default().Postgres
	pg.DSN = fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable", addrs[0], addrs[1])
	_, err := ConnectReplicationAt(context.Background(), pg, "tcp "+addrs[1])
	if err == nil {
		t.Fatal("connected to a listener that is not Postgres")
	}
	if !strings.Contains(err.Error(), addrs[1]+" (of "+addrs[0]+","+addrs[1]+", where the slot was read)") {
		t.Errorf("the error does not name the pinned server: %v", err)
	}
	if n := first.Accepted(); n != 0 {
		t.Errorf("the first host was dialled %d times; want never", n)
	}
	if n := second.Accepted(); n == 0 {
		t.Error("the pinned host was never dialled")
	}
}

// TestPinnedUnixSocketThroughLink: a DSN that reaches a Unix socket through
// a symbolic link to the server's socket directory is pinned to that
// server: Addr names the path the server bound, the dial the linked one
// (review of issue 32 item 9, finding 5; every takeover failed there).
func TestPinnedUnixSocketThroughLink(t *testing.T) {
	dir := t.TempDir()
	real, link := filepath.Join(dir, "real"), filepath.Join(dir, "link")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	server := dialtest.Listen(t, "unix", filepath.Join(real, ".s.PGSQL.5432"))
	c, err := net.Dial("unix", filepath.Join(link, ".s.PGSQL.5432"))
	if err != nil {
		t.Fatal(err)
	}
	addr := Addr(c) // as a connection opened with the DSN names its server
	c.Close()
	before := server.Accepted()
	pg := config.Default().Postgres
	pg.DSN = "host=" + link + " port=5432 user=postgres dbname=postgres connect_timeout=1"
	if _, err := ConnectReplicationAt(context.Background(), pg, addr); errors.Is(err, errOtherServer) || server.Accepted() == before {
		t.Errorf("pinned to %s, the socket through the link was not dialled: %v", addr, err)
	}
}
