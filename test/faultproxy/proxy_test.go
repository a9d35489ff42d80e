package faultproxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// echo starts a line echo server and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// roundTrip writes a line and reads it back within timeout.
func roundTrip(c net.Conn, r *bufio.Reader, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

func dial(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func TestFaults(t *testing.T) {
	target := echo(t)
	tests := []struct {
		name string
		run  func(t *testing.T, p *Proxy)
	}{
		{"forwards", func(t *testing.T, p *Proxy) {
			c, r := dial(t, p)
			if got, err := roundTrip(c, r, 2*time.Second); err != nil || got != "ping\n" {
				t.Fatalf("got %q, %v", got, err)
			}
		}},
		{"cut resets open connections", func(t *testing.T, p *Proxy) {
			c, r := dial(t, p)
			if _, err := roundTrip(c, r, 2*time.Second); err != nil {
				t.Fatal(err)
			}
			if n := p.Cut(); n != 1 {
				t.Fatalf("cut %d connections, want 1", n)
			}
			if _, err := roundTrip(c, r, 2*time.Second); err == nil {
				t.Fatal("connection still works after Cut")
			}
			c2, r2 := dial(t, p)
			if _, err := roundTrip(c2, r2, 2*time.Second); err != nil {
				t.Fatalf("new connection after Cut: %v", err)
			}
		}},
		{"refuse", func(t *testing.T, p *Proxy) {
			p.Refuse(true)
			if c, err := net.Dial("tcp", p.Addr()); err == nil {
				r := bufio.NewReader(c)
				_, err = roundTrip(c, r, 2*time.Second)
				c.Close()
				if err == nil {
					t.Fatal("refused connection works")
				}
			}
			p.Accept()
			c2, r2 := dial(t, p)
			if _, err := roundTrip(c2, r2, 2*time.Second); err != nil {
				t.Fatalf("after Accept: %v", err)
			}
		}},
		{"stall then resume", func(t *testing.T, p *Proxy) {
			c, r := dial(t, p)
			p.Stall()
			if _, err := roundTrip(c, r, 300*time.Millisecond); err == nil {
				t.Fatal("bytes flowed while stalled")
			}
			p.Resume()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if got, err := r.ReadString('\n'); err != nil || got != "ping\n" {
				t.Fatalf("after Resume got %q, %v", got, err)
			}
		}},
		{"slow", func(t *testing.T, p *Proxy) {
			c, r := dial(t, p)
			p.Slow(100 * time.Millisecond)
			start := time.Now()
			if _, err := roundTrip(c, r, 2*time.Second); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d < 200*time.Millisecond {
				t.Fatalf("round trip took %s, want at least 2×100ms", d)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, newProxy(t, target)) })
	}
}

// In Kafka mode every connection of a client goes through the proxy: stalling
// it stops production.
func TestKafkaMetadataRewrite(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := NewKafka(c.ListenAddrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.Addr()), kgo.RecordDeliveryTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte("a")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if p.Stats().Rewritten == 0 {
		t.Fatal("no Metadata response was rewritten")
	}
	p.Stall()
	done := make(chan error, 1)
	cl.Produce(context.Background(), &kgo.Record{Topic: "t", Value: []byte("b")}, func(_ *kgo.Record, err error) { done <- err })
	select {
	case err := <-done:
		t.Fatalf("record acknowledged (err %v) while the proxy was stalled: the client bypasses the proxy", err)
	case <-time.After(1500 * time.Millisecond):
	}
	p.Resume()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("after Resume: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("record not acknowledged after Resume")
	}
}
