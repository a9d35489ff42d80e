package test

import (
	"strings"
	"testing"
	"time"
)

// An instance whose connection to Postgres is held open by a middlebox that
// forwards nothing (the fault proxy's stall) stops claiming to stream once
// nothing has come from the server for the receive timeout (here the
// server's wal_sender_timeout of 2 s, read at start), while the walsender,
// hearing nothing either, releases the slot to a standby. Before, it
// answered /readyz 200 as "streaming" for as long as the stall lasted.
func TestSilentServerEndsTheStream(t *testing.T) {
	d := newDB(t)
	pgProxy := newProxy(t, hostPort(t, d.dsn), false)
	viaProxy := strings.Replace(d.dsn, hostPort(t, d.dsn), pgProxy.Addr(), 1) + "&options=-c%20wal_sender_timeout%3D2s"
	a := start(t, replace(d.env(), "OUTBOXD_POSTGRES_DSN", viaProxy))
	a.waitStreaming()
	a.waitReady(200, 10*time.Second)
	b := start(t, d.env("OUTBOXD_POSTGRES_STANDBY_POLL_INTERVAL=250ms"))
	m := listenRE.FindStringSubmatch(b.waitLog(`msg="serving metrics and health" addr=\S+`, 30*time.Second))
	b.addr = m[1]
	b.waitLog(`standby: another process holds the slot`, 30*time.Second)

	pgProxy.Stall()
	stalled := time.Now()
	b.waitLog(`took over the slot`, 30*time.Second)
	t.Logf("the standby took over %s into the stall", time.Since(stalled).Round(time.Millisecond))
	a.waitLog(`nothing came from the server`, 20*time.Second)
	a.waitReady(503, 10*time.Second)
	t.Logf("the stalled instance stopped claiming to stream %s into the stall", time.Since(stalled).Round(time.Millisecond))
	pgProxy.Resume()

	typ := d.name + "_silent"
	id, _ := insertEvent(t, d, typ, "k", `{}`)
	readUntil(t, []string{typ + "-events"}, 30*time.Second, 0, waitIDs(id))
	b.waitReady(200, 10*time.Second)
}
