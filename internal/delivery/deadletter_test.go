package delivery

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/dlq"
	"github.com/outboxd/outboxd/router"
)

// A row that routing refused after its topic was known (here a NULL key
// with require_key; also key_encoding string, a partition column, the
// headers column, the timestamp column, expand_json_payload) is
// dead-lettered with its key and payload columns and only the id and event
// type headers: not the record outboxd would have sent. The dead letter says
// so, and redrive leaves it to outboxd replay; one whose record was built
// and then refused by Kafka or the producer stays redrivable.
func TestRoutingFailureDeadLetterIsNotRedrivable(t *testing.T) {
	cfg := config.Default()
	cfg.Router.Poison.Policy, cfg.Router.Poison.DLQTopic = config.PoisonDLQ, "dlq"
	letter := func(p *router.RowError) *dlq.Letter {
		rec := DeadLetter(cfg, p)
		kr := &kgo.Record{Key: rec.Key, Value: rec.Value}
		for _, h := range rec.Headers {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		return dlq.Build("dlq", cfg.Router.IDHeader, []*kgo.Record{kr}).Letters[0]
	}
	l := letter(&router.RowError{EventID: "e1", Table: "public.outbox", Topic: "orders-events",
		Reason: "column aggregateid is NULL; a key is required (router.require_key)", Value: []byte(`{"a":1}`), EventType: "Placed"})
	if l.NotRedrivable == "" {
		var keys []string
		for _, h := range l.Headers {
			keys = append(keys, h.Key)
		}
		t.Errorf("a row refused by routing is redrivable: it would go to %s with key %q and headers %v", l.Topic, l.Key, keys)
	}
	l = letter(&router.RowError{EventID: "e2", Table: "public.outbox", Topic: "orders-events", Reason: "MESSAGE_TOO_LARGE",
		Key: []byte("k"), Value: []byte(`{"a":2}`), Headers: []router.Header{{Key: cfg.Router.IDHeader, Value: []byte("e2")}}})
	if l.NotRedrivable != "" {
		t.Errorf("a built record Kafka refused is not redrivable: %s", l.NotRedrivable)
	}
}
