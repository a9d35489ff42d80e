package sink

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Broker connections that read every produce response before franz-go does.
//
// When Kafka rejects a batch for good (INVALID_RECORD, MESSAGE_TOO_LARGE,
// TOPIC_AUTHORIZATION_FAILED, ...), franz-go fails that batch and every later
// one of its partition, but it reports the failure through a promise that runs
// on another goroutine. A record handed over in between starts a new batch
// (after a local producer-epoch bump, with no round trip to wait for) and can
// be written ahead of the rejected record, which the next run sends again:
// the key's first deliveries are then out of commit order.
// relay's TestProducerFailureKeepsKeyOrder widens that window on purpose ("reported
// late").
//
// A watched connection breaks the fence while it still holds the response,
// before franz-go can act on it. Every record handed over from then on is
// refused by Produce, and every batch franz-go has not written yet fails at
// its next drain, because its first record's context is the broken fence. So
// no record of a partition is written after one of its batches was rejected.
//
// The same connection notes the last retriable error a broker answered a
// produce or transaction request with (NOT_ENOUGH_REPLICAS, NOT_LEADER,
// COORDINATOR_NOT_AVAILABLE, ...). franz-go retries those without a word, so
// without the note a stall's error could only guess at its cause.

// dialer returns a franz-go dial function whose connections call reject
// before a produce response that rejects a batch reaches franz-go, and
// refused with each retriable error in a produce or transaction response.
func dialer(tlsCfg *tls.Config, reject, refused func(error)) func(ctx context.Context, network, host string) (net.Conn, error) {
	nd := &net.Dialer{Timeout: 10 * time.Second} // franz-go's default
	return func(ctx context.Context, network, host string) (net.Conn, error) {
		var (
			c   net.Conn
			err error
		)
		if tlsCfg == nil {
			c, err = nd.DialContext(ctx, network, host)
		} else {
			cfg := tlsCfg.Clone()
			if cfg.ServerName == "" {
				server, _, err := net.SplitHostPort(host)
				if err != nil {
					return nil, fmt.Errorf("unable to split host:port for dialing: %w", err)
				}
				cfg.ServerName = server
			}
			c, err = (&tls.Dialer{NetDialer: nd, Config: cfg}).DialContext(ctx, network, host)
		}
		if err != nil {
			return nil, err
		}
		return &watchedConn{Conn: c, reject: reject, refused: refused, produce: map[int32]int16{}}, nil
	}
}

// watchedConn follows the request frames written (size, then api key,
// version and correlation id) to know which responses answer produce
// requests, and reads responses a whole frame at a time so that it can look
// into a produce response before handing any of it on.
type watchedConn struct {
	net.Conn
	reject  func(error)
	refused func(error) // nil: not noted

	mu      sync.Mutex
	produce map[int32]int16    // correlation id -> produce request version
	txn     map[int32][2]int16 // correlation id -> key and version of a transaction request

	// Write side (franz-go writes from one goroutine per connection).
	wsize [4]byte
	wn    int    // bytes of the size prefix seen
	whdr  []byte // the first 8 bytes of the frame body
	wleft int    // bytes of the frame body still to pass

	// Read side.
	rbuf []byte // the frame being handed on
	roff int
	raw  bool // an oversized frame: hand the rest of the stream on as it comes
}

// maxFrame is franz-go's default BrokerMaxReadBytes: a larger response is an
// error to franz-go, which reads its size and closes the connection. The
// watched connection must not buffer such a frame first.
const maxFrame = 100 << 20

func (c *watchedConn) Write(p []byte) (int, error) {
	c.follow(p)
	return c.Conn.Write(p)
}

// follow parses the request frames in p, written as a stream.
func (c *watchedConn) follow(p []byte) {
	for len(p) > 0 {
		if c.wleft == 0 { // at a size prefix
			k := copy(c.wsize[c.wn:], p)
			c.wn += k
			p = p[k:]
			if c.wn < 4 {
				return
			}
			c.wn = 0
			c.wleft = max(0, int(int32(binary.BigEndian.Uint32(c.wsize[:]))))
			c.whdr = c.whdr[:0]
			continue
		}
		if len(c.whdr) < 8 {
			k := min(8-len(c.whdr), len(p), c.wleft)
			c.whdr = append(c.whdr, p[:k]...)
			p, c.wleft = p[k:], c.wleft-k
			if len(c.whdr) == 8 {
				key, version := int16(binary.BigEndian.Uint16(c.whdr)), int16(binary.BigEndian.Uint16(c.whdr[2:]))
				corr := int32(binary.BigEndian.Uint32(c.whdr[4:]))
				switch {
				case key == int16(kmsg.Produce):
					c.mu.Lock()
					c.produce[corr] = version
					c.mu.Unlock()
				case c.refused != nil && noted(key):
					c.mu.Lock()
					if c.txn == nil {
						c.txn = map[int32][2]int16{}
					}
					c.txn[corr] = [2]int16{key, version}
					c.mu.Unlock()
				}
			}
			continue
		}
		k := min(len(p), c.wleft)
		p, c.wleft = p[k:], c.wleft-k
	}
}

func (c *watchedConn) Read(p []byte) (int, error) {
	if c.roff == len(c.rbuf) && c.raw {
		return c.Conn.Read(p)
	}
	if c.roff == len(c.rbuf) {
		if err := c.readFrame(); err != nil {
			return 0, err
		}
	}
	n := copy(p, c.rbuf[c.roff:])
	c.roff += n
	return n, nil
}

// readFrame reads one whole response frame into rbuf and inspects it.
func (c *watchedConn) readFrame() error {
	c.rbuf, c.roff = c.rbuf[:0], 0
	var size [4]byte
	if _, err := io.ReadFull(c.Conn, size[:]); err != nil {
		return err
	}
	n := int(int32(binary.BigEndian.Uint32(size[:])))
	if n < 0 || n > maxFrame {
		// franz-go rejects the frame from its size alone.
		c.rbuf, c.raw = append(c.rbuf, size[:]...), true
		return nil
	}
	if cap(c.rbuf) < 4+n {
		c.rbuf = make([]byte, 0, 4+n)
	}
	c.rbuf = append(c.rbuf, size[:]...)
	c.rbuf = c.rbuf[:4+n]
	if _, err := io.ReadFull(c.Conn, c.rbuf[4:]); err != nil {
		c.rbuf = c.rbuf[:0]
		return err
	}
	c.inspect(c.rbuf[4:])
	return nil
}

// inspect calls reject if body answers a produce request and rejects a
// batch.
func (c *watchedConn) inspect(body []byte) {
	if len(body) < 4 {
		return
	}
	corr := int32(binary.BigEndian.Uint32(body))
	c.mu.Lock()
	version, ok := c.produce[corr]
	delete(c.produce, corr)
	txn, isTxn := c.txn[corr]
	delete(c.txn, corr)
	c.mu.Unlock()
	if isTxn {
		c.inspectTxn(txn[0], txn[1], body[4:])
		return
	}
	if !ok {
		return
	}
	resp := kmsg.ProduceResponse{Version: version}
	if !readResponse(&resp, body[4:]) {
		return // franz-go fails the request itself
	}
	var retried error
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			err := kerr.ErrorForCode(p.ErrorCode)
			if rejects(err) {
				c.reject(fmt.Errorf("a broker rejected a batch for %s: %w", partitionName(t, p.Partition), err))
				return
			}
			if kerr.IsRetriable(err) && retried == nil {
				retried = fmt.Errorf("answered a produce request for %s with %w", partitionName(t, p.Partition), err)
			}
		}
	}
	if retried != nil && c.refused != nil {
		c.refused(retried)
	}
}

// partitionName names a partition of a produce response, whose topic has
// no name from version 13 on (a topic id instead, which kafka-topics
// --describe shows with the name).
func partitionName(t kmsg.ProduceResponseTopic, partition int32) string {
	if t.Topic == "" {
		return fmt.Sprintf("partition %d of the topic with id %s", partition, topicID(t.TopicID))
	}
	return fmt.Sprintf("%s[%d]", t.Topic, partition)
}

// topicID formats a topic id as Kafka's tools print it (base64 URL, no
// padding).
func topicID(id [16]byte) string {
	return base64.RawURLEncoding.EncodeToString(id[:])
}

// readResponse decodes a response body (after the correlation id) into
// resp, whose version is set.
func readResponse(resp kmsg.Response, src []byte) bool {
	if resp.IsFlexible() {
		r := kbin.Reader{Src: src}
		kmsg.SkipTags(&r)
		if r.Complete() != nil {
			return false
		}
		src = r.Src
	}
	return resp.ReadFrom(src) == nil
}

// noted reports whether the errors of responses to requests with key are
// noted: the requests of an idempotent and a transactional producer.
func noted(key int16) bool {
	switch kmsg.Key(key) {
	case kmsg.InitProducerID, kmsg.AddPartitionsToTxn, kmsg.EndTxn, kmsg.FindCoordinator:
		return true
	}
	return false
}

// inspectTxn calls refused with the first retriable error of a response to
// a request that noted accepts. CONCURRENT_TRANSACTIONS is left out: it
// answers a transaction begun right after a commit, for a few milliseconds.
func (c *watchedConn) inspectTxn(key, version int16, body []byte) {
	resp := kmsg.ResponseForKey(key)
	if resp == nil {
		return
	}
	resp.SetVersion(version)
	if !readResponse(resp, body) {
		return
	}
	var codes []int16
	switch r := resp.(type) {
	case *kmsg.InitProducerIDResponse:
		codes = append(codes, r.ErrorCode)
	case *kmsg.EndTxnResponse:
		codes = append(codes, r.ErrorCode)
	case *kmsg.FindCoordinatorResponse:
		codes = append(codes, r.ErrorCode)
		for _, co := range r.Coordinators {
			codes = append(codes, co.ErrorCode)
		}
	case *kmsg.AddPartitionsToTxnResponse:
		codes = append(codes, r.ErrorCode)
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				codes = append(codes, p.ErrorCode)
			}
		}
	}
	for _, code := range codes {
		if err := kerr.ErrorForCode(code); kerr.IsRetriable(err) && err != kerr.ConcurrentTransactions {
			err = fmt.Errorf("answered %s with %w", kmsg.NameForKey(key), err)
			if key == int16(kmsg.FindCoordinator) {
				err = &lookupRefusal{err}
			}
			c.refused(err)
			return
		}
	}
}

// rejects reports whether franz-go fails a batch answered with err instead
// of retrying it (sink.go, handleReqRespBatch).
func rejects(err error) bool {
	switch {
	case err == nil,
		err == kerr.DuplicateSequenceNumber, // treated as success
		err == kerr.ConcurrentTransactions,  // retried
		// franz-go bumps the producer epoch and resends the batch.
		err == kerr.OutOfOrderSequenceNumber,
		err == kerr.UnknownProducerID,
		err == kerr.InvalidProducerIDMapping,
		err == kerr.InvalidProducerEpoch:
		return false
	case err == kerr.CorruptMessage: // retriable to Kafka, not to franz-go
		return true
	}
	return !kerr.IsRetriable(err)
}

// lookupRefusal is a coordinator lookup's refusal (FindCoordinator), which
// does not replace a produce or transaction request's (noteRefusal).
type lookupRefusal struct{ error }

func (e *lookupRefusal) Unwrap() error { return e.error }
