package sink_test

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// After Kafka rejects a batch for good, Produce refuses every later record,
// and its error carries the rejection (not a bare "context canceled"), so
// the operator reads why from whichever error reaches the log first. The
// error is a *sink.NotHandedOverError.
func TestProduceAfterRejectionSaysWhy(t *testing.T) {
	p, ctx := rejectingProducer(t)
	rec := func(id string) *router.Record {
		return &router.Record{Topic: topic, Key: []byte("k"), Value: []byte("v"), EventID: id, Partition: -1}
	}
	failed := make(chan error, 1)
	if err := p.Produce(ctx, rec("1"), func(err error) { failed <- err }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-failed:
		if !errors.Is(err, kerr.InvalidRecord) {
			t.Fatalf("first record: got %v, want INVALID_RECORD", err)
		}
	case <-ctx.Done():
		t.Fatal("the rejected record was never reported")
	}
	err := p.Produce(ctx, rec("2"), func(error) { t.Error("a record after the rejection was handed over") })
	if !errors.Is(err, kerr.InvalidRecord) {
		t.Errorf("Produce after the rejection: got %v, want an error carrying INVALID_RECORD", err)
	}
	// Typed, so that a caller tells it from the record's own fault and may
	// send the record again with a new producer.
	var nho *sink.NotHandedOverError
	if !errors.As(err, &nho) || nho.EventID != "2" {
		t.Errorf("Produce after the rejection: got %#v, want a *sink.NotHandedOverError for event 2", err)
	}
}
