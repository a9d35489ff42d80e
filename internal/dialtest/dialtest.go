// Package dialtest gives tests servers that only count the connections
// made to them: for tests of which address a client dials, not of what it
// says there.
package dialtest

import (
	"net"
	"sync/atomic"
	"testing"
)

// Counter is a listener that accepts each connection, counts it and closes
// it at once (so a Postgres client's attempt fails after the dial).
type Counter struct {
	l        net.Listener
	accepted atomic.Int32
}

// Listen starts a Counter on network and address ("tcp", "127.0.0.1:0";
// "unix", a socket path), closed at the test's cleanup.
func Listen(t testing.TB, network, address string) *Counter {
	t.Helper()
	l, err := net.Listen(network, address)
	if err != nil {
		t.Fatal(err)
	}
	c := &Counter{l: l}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			c.accepted.Add(1)
			conn.Close()
		}
	}()
	return c
}

// Addr is the address it listens on.
func (c *Counter) Addr() string { return c.l.Addr().String() }

// Accepted is how many connections it accepted so far.
func (c *Counter) Accepted() int32 { return c.accepted.Load() }
