package sink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The watched connection must follow request frames however they are split
// into writes, and call reject for exactly the produce responses that make
// franz-go fail a batch, before handing the response on unchanged.
func TestWatchedConnSeesRejections(t *testing.T) {
	for _, tt := range []struct {
		name    string
		version int16
		code    int16
		produce bool // the response answers a produce request
		want    bool
	}{
		{"invalid record v7", 7, kerr.InvalidRecord.Code, true, true},
		{"message too large v9 (flexible)", 9, kerr.MessageTooLarge.Code, true, true},
		{"corrupt message v11", 11, kerr.CorruptMessage.Code, true, true},
		{"topic authorization v9", 9, kerr.TopicAuthorizationFailed.Code, true, true},
		{"not leader is retried", 9, kerr.NotLeaderForPartition.Code, true, false},
		{"out of order sequence is resent", 9, kerr.OutOfOrderSequenceNumber.Code, true, false},
		{"duplicate sequence is success", 9, kerr.DuplicateSequenceNumber.Code, true, false},
		{"success", 9, 0, true, false},
		{"not a produce response", 9, kerr.InvalidRecord.Code, false, false},
		{"message too large v13 (topic id)", 13, kerr.MessageTooLarge.Code, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client, server := net.Pipe()
			defer server.Close()
			var rejected []error
			c := &watchedConn{Conn: client, reject: func(err error) { rejected = append(rejected, err) }, produce: map[int32]int16{}}
			defer c.Close()

			// Requests: a raw SASL frame shorter than a request header,
			// then the request answered below (a produce request or a
			// metadata request with the same correlation id), each
			// written a few bytes at a time.
			f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("outboxd"))
			var req kmsg.Request = &kmsg.ProduceRequest{Version: tt.version, Acks: -1, TimeoutMillis: 1000}
			if !tt.produce {
				req = &kmsg.MetadataRequest{Version: 9}
			}
			wire := append([]byte{0, 0, 0, 3, 'a', 'b', 'c'}, f.AppendRequest(nil, req, 42)...)
			go func() { _, _ = io.Copy(io.Discard, server) }()
			for i := 0; i < len(wire); i += 5 {
				if _, err := c.Write(wire[i:min(i+5, len(wire))]); err != nil {
					t.Fatal(err)
				}
			}

			// The response, read back in small pieces.
			resp := kmsg.ProduceResponse{Version: tt.version}
			rt := kmsg.NewProduceResponseTopic()
			rt.Topic = "orders-events"
			if tt.version >= 13 {
				rt.Topic, rt.TopicID = "", [16]byte{1, 2, 3}
			}
			for p, code := range []int16{0, tt.code} {
				rp := kmsg.NewProduceResponseTopicPartition()
				rp.Partition, rp.ErrorCode = int32(p), code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
			body := binary.BigEndian.AppendUint32(nil, 42)
			if resp.IsFlexible() {
				body = append(body, 0) // no header tags
			}
			body = resp.AppendTo(body)
			frame := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
			frame = append(frame, body...)
			go func() { _, _ = server.Write(frame) }()
			got := make([]byte, 0, len(frame))
			buf := make([]byte, 7)
			for len(got) < len(frame) {
				n, err := c.Read(buf)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, buf[:n]...)
			}
			if !bytes.Equal(got, frame) {
				t.Fatalf("the response was changed on its way through")
			}
			if (len(rejected) > 0) != tt.want {
				t.Fatalf("rejected = %v, want a rejection: %v", rejected, tt.want)
			}
			if tt.want && !errors.Is(rejected[0], kerr.ErrorForCode(tt.code)) {
				t.Errorf("rejection %v does not wrap %v", rejected[0], kerr.ErrorForCode(tt.code))
			}
			want := "orders-events[1]" // from v13 on, the topic id as kafka-topics prints it
			if tt.version >= 13 {
				want = "partition 1 of the topic with id AQIDAAAAAAAAAAAAAAAAAA:"
			}
			if tt.want && !strings.Contains(rejected[0].Error(), want) {
				t.Errorf("rejection %q does not name %s", rejected[0], want)
			}
			if len(c.produce) != 0 {
				t.Errorf("%d produce requests still tracked after their response", len(c.produce))
			}
		})
	}
}

// A response larger than franz-go accepts is handed on by its size, without
// being read into memory first.
func TestWatchedConnOversizedFrame(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	c := &watchedConn{Conn: client, reject: func(error) { t.Error("reject called") }, produce: map[int32]int16{}}
	defer c.Close()
	go func() { _, _ = server.Write([]byte{0x40, 0, 0, 0, 1, 2, 3}) }() // 1 GiB announced
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil || !bytes.Equal(buf[:n], []byte{0x40, 0, 0, 0}) {
		t.Fatalf("first read = %x, %v; want the size prefix", buf[:n], err)
	}
	if cap(c.rbuf) > 1<<10 {
		t.Fatalf("buffered %d bytes for an oversized frame", cap(c.rbuf))
	}
	n, err = c.Read(buf)
	if err != nil || !bytes.Equal(buf[:n], []byte{1, 2, 3}) {
		t.Fatalf("second read = %x, %v; want the stream as it comes", buf[:n], err)
	}
}

// A coordinator lookup's refusal is told apart from a transaction
// request's, so that it never hides what the brokers answered the records
// (noteRefusal, refusedSince).
func TestInspectTxnTellsLookupsApart(t *testing.T) {
	for _, tt := range []struct {
		name   string
		resp   kmsg.Response
		lookup bool
	}{
		{"FindCoordinator", &kmsg.FindCoordinatorResponse{Version: 4, Coordinators: []kmsg.FindCoordinatorResponseCoordinator{{ErrorCode: kerr.CoordinatorNotAvailable.Code}}}, true},
		{"EndTxn", &kmsg.EndTxnResponse{Version: 3, ErrorCode: kerr.CoordinatorNotAvailable.Code}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []error
			c := &watchedConn{refused: func(err error) { got = append(got, err) }}
			var body []byte
			if tt.resp.IsFlexible() {
				body = append(body, 0) // no header tags
			}
			body = tt.resp.AppendTo(body)
			c.inspectTxn(tt.resp.Key(), tt.resp.GetVersion(), body)
			if len(got) != 1 || !errors.Is(got[0], kerr.CoordinatorNotAvailable) {
				t.Fatalf("refused with %v, want COORDINATOR_NOT_AVAILABLE once", got)
			}
			var lr *lookupRefusal
			if errors.As(got[0], &lr) != tt.lookup {
				t.Errorf("%v: a lookup's refusal: %v, want %v", got[0], !tt.lookup, tt.lookup)
			}
		})
	}
}
