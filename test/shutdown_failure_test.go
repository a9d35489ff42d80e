package test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A record that Kafka rejects while outboxd waits, on SIGTERM, for its
// in-flight records ends the wait at once: outboxd exits with the rejection
// (not confirming past it), instead of waiting out shutdown_timeout and
// reporting a timeout.
func TestShutdownEndsOnARejectionWhileDraining(t *testing.T) {
	d := newDB(t)
	kProxy := newProxy(t, svc.brokers[0], true)
	typ := d.name + "_rej"
	maxBytes := "1000"
	if _, err := kadmOn(t, svc.brokers).CreateTopic(context.Background(), 1, 1, map[string]*string{"max.message.bytes": &maxBytes}, typ+"-events"); err != nil {
		t.Fatal(err)
	}
	env := replace(d.env("OUTBOXD_SHUTDOWN_TIMEOUT=60s"), "OUTBOXD_KAFKA_BROKERS", kProxy.Addr())
	p := start(t, env)
	p.waitStreaming()
	first, _ := insertEvent(t, d, typ, "k", `{}`)
	readUntil(t, []string{typ + "-events"}, 30*time.Second, 0, waitIDs(first))

	kProxy.Stall()
	_, rejected := insertEvent(t, d, typ, "k", `{"pad": "`+strings.Repeat("x", 2000)+`"}`) // over the topic's max.message.bytes
	deadline := time.Now().Add(30 * time.Second)
	for {
		if v, _ := p.metric("outboxd_sink_records_in_flight"); v >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the record never was in flight")
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(500 * time.Millisecond)
	stopped := time.Now()
	kProxy.Resume()
	code := p.waitExit(30 * time.Second)
	if took := time.Since(stopped); took > 20*time.Second {
		t.Errorf("outboxd exited %s after Kafka's rejection: it waited out shutdown_timeout", took.Round(time.Second))
	}
	if code == 0 || !strings.Contains(p.logs.String(), "MESSAGE_TOO_LARGE") {
		t.Errorf("exit %d, want non-zero with Kafka's rejection (MESSAGE_TOO_LARGE) in the log:\n%s", code, p.logs.String())
	}
	// The rejected event was never written: the slot must not be confirmed
	// past it, or it would be lost.
	if got := d.confirmedFlush(t); got > rejected {
		t.Errorf("slot confirmed at %X, past the rejected record's transaction (written at %X)", got, rejected)
	}
}
