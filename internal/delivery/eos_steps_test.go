package delivery

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/internal/eos"
	"github.com/outboxd/outboxd/wal"
)

// Review of issue 34 item 1: the code that carries out the machine's
// steps keeps the ack rule. A Kafka commit that fails releases no hold: the slot is never confirmed
// past a transaction whose Kafka transaction did not commit.
func TestEOSFailedCommitConfirmsNothing(t *testing.T) {
	g := newEOSRig(t, 3*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, _, run := g.pipeline(t, ctx, "outboxd-failcommit")
	g.c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		g.c.KeepControl()
		r := req.(*kmsg.EndTxnRequest)
		if !r.Commit {
			return nil, nil, false
		}
		resp := r.ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.InvalidTxnState.Code
		return resp, nil, true
	})
	batches := make(chan []wal.Item, 1)
	batches <- []wal.Item{begin(0x200), change(wal.Insert, 0x180, id1, "o-1", `{"n": 1}`), commit(0x210)}
	err := p.RunExactlyOnce(run, batches, g.server())
	t.Logf("RunExactlyOnce = %v", err)
	if err == nil {
		t.Fatal("RunExactlyOnce succeeded with every commit failing")
	}
	if got := p.tracker.Confirmed(); got != 0x100 {
		t.Errorf("confirmed %s after the Kafka commit failed; want 0/100: T1 is not in Kafka", got)
	}
}

// A transaction skipped whole (in Kafka before this run) ends at its
// Commit: the next one is delivered and confirmed.
func TestEOSSkipEndsAtItsCommit(t *testing.T) {
	g := newEOSRig(t, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, producer, run := g.pipeline(t, ctx, "outboxd-skipends")
	x, err := p.startExactlyOnce(run, producer, g.server())
	if err != nil {
		t.Fatal(err)
	}
	// Pretend the position read was 0/300: T1 (ends 0/210) is skipped.
	x.Machine = p.newExactlyOnce(producer, g.system, 0, positionAt(0x300)).Machine
	p.eos = x
	for _, item := range []wal.Item{begin(0x200), change(wal.Insert, 0x180, id1, "o-1", `{"n": 1}`), commit(0x210),
		begin(0x400), change(wal.Insert, 0x380, id2, "o-2", `{"n": 2}`), commit(0x410)} {
		if err := p.Handle(item); err != nil {
			t.Fatal(err)
		}
	}
	if err := x.Boundary(run, false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.tracker.Confirmed() != 0x410 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := p.tracker.Confirmed(); got != 0x410 {
		t.Errorf("confirmed %s; want T2's end 0/410 (T1 skipped, T2 delivered and committed)", got)
	}
}

func positionAt(lsn wal.LSN) eos.Position { return eos.Position{LSN: lsn} }
