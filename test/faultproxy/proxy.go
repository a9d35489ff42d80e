// Package faultproxy is a loopback TCP proxy that tests put between outboxd
// and Postgres or Kafka to inject network faults: connections cut (reset),
// refused, stalled (open but silent) and slowed (latency per chunk).
//
// A Kafka broker tells its clients where to connect in its Metadata
// responses, so a plain proxy would only carry the bootstrap connection. In
// Kafka mode the proxy parses the Kafka framing and rewrites every broker
// address in Metadata responses to its own, so that all of a client's
// connections go through it (one proxy per broker; a single-broker cluster
// needs one).
//
// A Proxy listens on 127.0.0.1 only. Its zero faults state forwards bytes
// unchanged. All methods are safe for concurrent use.
package faultproxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Proxy forwards connections from its address to a target.
type Proxy struct {
	ln     net.Listener
	target string
	kafka  bool

	mu      sync.Mutex
	conns   map[*link]struct{}
	refuse  bool
	gate    chan struct{} // closed while bytes may flow; open (unclosed) while stalled
	latency time.Duration
	closed  bool
	wg      sync.WaitGroup

	stats Stats
}

// Stats counts what the proxy did.
type Stats struct {
	Accepted, Refused, Cut int
	Rewritten              int // Kafka Metadata responses rewritten
}

// New starts a proxy on 127.0.0.1 (a free port) to target (host:port).
func New(target string) (*Proxy, error) { return listen(target, false) }

// NewKafka starts a proxy to a Kafka broker that rewrites broker addresses in
// Metadata responses to the proxy's own address.
func NewKafka(target string) (*Proxy, error) { return listen(target, true) }

func listen(target string, kafka bool) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listening: %w", err)
	}
	gate := make(chan struct{})
	close(gate)
	p := &Proxy{ln: ln, target: target, kafka: kafka, conns: map[*link]struct{}{}, gate: gate}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Cut resets every open connection (both sides see ECONNRESET). New
// connections are accepted as before.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	ls := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		ls = append(ls, l)
	}
	p.stats.Cut += len(ls)
	p.mu.Unlock()
	for _, l := range ls {
		l.reset()
	}
	return len(ls)
}

// Refuse makes the proxy reset new connections at once (the peer looks
// down) until Accept; with cut it also resets the open ones.
func (p *Proxy) Refuse(cut bool) {
	p.mu.Lock()
	p.refuse = true
	p.mu.Unlock()
	if cut {
		p.Cut()
	}
}

// Accept undoes Refuse.
func (p *Proxy) Accept() {
	p.mu.Lock()
	p.refuse = false
	p.mu.Unlock()
}

// Stall stops forwarding bytes in both directions; connections stay open and
// new ones are accepted (and stall too) until Resume.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already stalled
	}
}

// Resume undoes Stall.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// Slow delays every forwarded chunk by d (0 restores full speed).
func (p *Proxy) Slow(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Close stops listening, resets every connection and waits for the proxy's
// goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Resume()
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed || p.refuse {
			p.stats.Refused++
			p.mu.Unlock()
			resetConn(c)
			continue
		}
		p.stats.Accepted++
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		resetConn(client)
		return
	}
	l := &link{client: client, server: server}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.reset()
		return
	}
	p.conns[l] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
		l.reset()
	}()
	var wg sync.WaitGroup
	wg.Add(2)
	if p.kafka {
		var mu sync.Mutex
		meta := map[int32]int16{} // correlation id -> Metadata request version
		go func() { defer wg.Done(); p.pumpKafkaRequests(l, client, server, &mu, meta) }()
		go func() { defer wg.Done(); p.pumpKafkaResponses(l, server, client, &mu, meta) }()
	} else {
		go func() { defer wg.Done(); p.pump(l, client, server) }()
		go func() { defer wg.Done(); p.pump(l, server, client) }()
	}
	wg.Wait()
}

// wait blocks while the proxy is stalled, then applies the latency. It
// returns false when the link was reset meanwhile.
func (p *Proxy) wait(l *link) bool {
	p.mu.Lock()
	gate, latency := p.gate, p.latency
	p.mu.Unlock()
	select {
	case <-gate:
	case <-l.done():
		return false
	}
	if latency > 0 {
		select {
		case <-time.After(latency):
		case <-l.done():
			return false
		}
	}
	// Stall may have begun during the latency.
	p.mu.Lock()
	gate = p.gate
	p.mu.Unlock()
	select {
	case <-gate:
		return true
	case <-l.done():
		return false
	}
}

func (p *Proxy) pump(l *link, from, to net.Conn) {
	defer l.reset()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			if !p.wait(l) {
				return
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// readFrame reads one size-prefixed Kafka frame (size included).
func readFrame(r io.Reader) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n > 256<<20 {
		return nil, fmt.Errorf("frame of %d bytes", n)
	}
	frame := make([]byte, 4+n)
	copy(frame, size[:])
	_, err := io.ReadFull(r, frame[4:])
	return frame, err
}

func (p *Proxy) pumpKafkaRequests(l *link, from, to net.Conn, mu *sync.Mutex, meta map[int32]int16) {
	defer l.reset()
	for {
		frame, err := readFrame(from)
		if err != nil {
			return
		}
		if len(frame) >= 12 {
			key := int16(binary.BigEndian.Uint16(frame[4:]))
			version := int16(binary.BigEndian.Uint16(frame[6:]))
			corr := int32(binary.BigEndian.Uint32(frame[8:]))
			if key == int16(kmsg.Metadata) {
				mu.Lock()
				meta[corr] = version
				mu.Unlock()
			}
		}
		if !p.wait(l) {
			return
		}
		if _, err := to.Write(frame); err != nil {
			return
		}
	}
}

func (p *Proxy) pumpKafkaResponses(l *link, from, to net.Conn, mu *sync.Mutex, meta map[int32]int16) {
	defer l.reset()
	host, portStr, _ := net.SplitHostPort(p.Addr())
	port, _ := strconv.Atoi(portStr)
	for {
		frame, err := readFrame(from)
		if err != nil {
			return
		}
		if len(frame) >= 8 {
			corr := int32(binary.BigEndian.Uint32(frame[4:]))
			mu.Lock()
			version, isMeta := meta[corr]
			delete(meta, corr)
			mu.Unlock()
			if isMeta {
				if out, err := rewriteMetadata(frame, version, host, int32(port)); err == nil {
					frame = out
					p.mu.Lock()
					p.stats.Rewritten++
					p.mu.Unlock()
				}
			}
		}
		if !p.wait(l) {
			return
		}
		if _, err := to.Write(frame); err != nil {
			return
		}
	}
}

// rewriteMetadata points every broker of a Metadata response at host:port.
func rewriteMetadata(frame []byte, version int16, host string, port int32) ([]byte, error) {
	resp := kmsg.NewPtrMetadataResponse()
	resp.Version = version
	body := frame[8:]
	if resp.IsFlexible() { // response header v1: a tagged-field buffer
		n, used := binary.Uvarint(body)
		if used <= 0 || n != 0 {
			return nil, errors.New("metadata response header has tagged fields")
		}
		body = body[used:]
	}
	if err := resp.ReadFrom(body); err != nil {
		return nil, err
	}
	for i := range resp.Brokers {
		resp.Brokers[i].Host = host
		resp.Brokers[i].Port = port
	}
	out := make([]byte, 8, len(frame)+64)
	copy(out[4:8], frame[4:8])
	if resp.IsFlexible() {
		out = append(out, 0)
	}
	out = resp.AppendTo(out)
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	return out, nil
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	once           sync.Once
	ch             chan struct{}
	chOnce         sync.Once
}

func (l *link) done() chan struct{} {
	l.chOnce.Do(func() { l.ch = make(chan struct{}) })
	return l.ch
}

func (l *link) reset() {
	l.once.Do(func() {
		close(l.done())
		resetConn(l.client)
		resetConn(l.server)
	})
}

// resetConn closes c with SO_LINGER 0, so the peer sees a reset rather than
// an orderly end of stream.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
