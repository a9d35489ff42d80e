package test

import (
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// stallingListener accepts connections and never answers, as a host that
// is up but hung does; accepted receives each connection's arrival.
func stallingListener(t *testing.T) (addr string, accepted <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{}, 16)
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range conns {
					c.Close()
				}
				return
			}
			conns = append(conns, c)
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String(), ch
}

// SIGTERM while the start-up checks wait for a server is a clean stop, exit
// 0 and no error, as SIGTERM while streaming is (issue 32 item 17): not an
// ERROR that blames postgres.dsn for the cancelled connection.
func TestStopDuringStartup(t *testing.T) {
	d := newDB(t)
	for _, tc := range []struct {
		name string
		env  func(addr string) []string
	}{
		{"postgres accepts and never answers", func(addr string) []string {
			// connect_timeout outlasts the test: only the signal ends the wait.
			return replace(d.env(), "OUTBOXD_POSTGRES_DSN", "postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=60")
		}},
		{"kafka accepts and never answers", func(addr string) []string {
			return replace(d.env(), "OUTBOXD_KAFKA_BROKERS", addr)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, accepted := stallingListener(t)
			p := start(t, tc.env(addr))
			select {
			case <-accepted:
			case <-p.done:
				t.Fatalf("outboxd exited before it connected to the stalling server")
			case <-time.After(30 * time.Second):
				t.Fatal("outboxd did not connect to the stalling server within 30s")
			}
			time.Sleep(200 * time.Millisecond) // well into the wait
			if code := p.stop(syscall.SIGTERM, 15*time.Second); code != 0 {
				t.Fatalf("SIGTERM during the start-up checks: exit %d, want 0; log:\n%s", code, p.logs.String())
			}
			for _, line := range strings.Split(p.logs.String(), "\n") {
				if strings.Contains(line, "level=ERROR") || strings.HasPrefix(line, "outboxd: ") {
					t.Fatalf("SIGTERM during the start-up checks logged an error: %s", line)
				}
			}
			// The Info line names the cancellation it stopped on.
			t.Log(p.waitLog(`msg="stopped during the start-up checks".* err=.*`, time.Second))
		})
	}
}
