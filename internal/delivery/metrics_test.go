package delivery

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/wal"
)

// Issue 35 §1 "Everything per table": with several outbox tables, each
// table's changes count under its own table label, and every listed table's
// series exists from the start (at zero).
func TestPipelineCountsPerTable(t *testing.T) {
	tp := newTestPipeline(t, func(c *config.Config) {
		c.Postgres.Table = ""
		c.Postgres.Tables = []config.TableEntry{{Name: "public.outbox"}, {Name: "orders.outbox"}}
		c.Router.Messages.Unowned = config.UnownedIgnore
	})
	orders := *outboxRel
	orders.ID, orders.Namespace = 16500, "orders"
	ch := change(wal.Insert, 0x190, id2, "o-2", `{}`)
	ch.Relation = &orders
	tp.handle(t, begin(0x200), change(wal.Insert, 0x180, id1, "o-1", `{}`), change(wal.Delete, 0x188, id1, "o-1", `{}`), ch, commit(0x210))
	for _, c := range []struct {
		op, table string
		want      float64
	}{
		{"insert", "public.outbox", 1}, {"delete", "public.outbox", 1}, {"insert", "orders.outbox", 1},
		{"delete", "orders.outbox", 0}, {"update", "orders.outbox", 0}, {"message", "orders.outbox", 0},
	} {
		if got := testutil.ToFloat64(tp.m.changes.WithLabelValues(c.op, c.table)); got != c.want {
			t.Errorf("outboxd_wal_changes_total{op=%q,table=%q} = %v, want %v", c.op, c.table, got, c.want)
		}
	}
	// Every listed table's series and the untabled ops, nothing else.
	if n := testutil.CollectAndCount(tp.m.changes); n != 2*4+len(untabled) {
		t.Errorf("%d series of outboxd_wal_changes_total, want %d", n, 2*4+len(untabled))
	}
	if n := testutil.CollectAndCount(tp.m.deadLettered); n != 2 {
		t.Errorf("%d series of outboxd_router_dead_lettered_total, want one per table (2)", n)
	}
}
