package preflight

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/shard"
)

// Second review of issue 35 §1, S3: a shard's publication that does not
// publish inserts (nothing reaches outboxd), or that publishes a
// partitioned outbox table under each partition's name (each partition's
// own filter, none, applies: every shard delivers its rows), is refused
// at start-up with the statement that puts it right: one transaction over
// every shard publication with wrong options, and what became of the rows
// before it (third review, S3). It needs the test bed's Postgres.
func TestShardPublicationOptionsChecked(t *testing.T) {
	ctx := context.Background()
	conn := testenv.Connect(t, "shardopts", `CREATE TABLE outbox (k text, payload text);
		CREATE TABLE parts (k text, payload text) PARTITION BY LIST (k); CREATE TABLE parts_a PARTITION OF parts DEFAULT`)
	one := shard.OptionsSQL("outboxd_1of2")
	both := shard.TxSQL([]string{shard.OptionsSQL("outboxd_0of2"), one})
	tests := []struct {
		name, table, create, other, want, fix string
	}{
		{"publish", "outbox", `FOR TABLE public.outbox WHERE (` + shard.Filter("k", 1, 2) + `) WITH (publish = 'update')`, "", "does not publish INSERTs", one},
		{"via root", "parts", `FOR TABLE public.parts WITH (publish_via_partition_root = false)`, "", "publishes its rows under each partition's name", one},
		{"right", "outbox", `FOR TABLE public.outbox WHERE (` + shard.Filter("k", 1, 2) + `) WITH (publish = 'insert')`, "", "", ""},
		{"publish, two shards", "outbox", `FOR TABLE public.outbox WHERE (` + shard.Filter("k", 1, 2) + `) WITH (publish = 'update')`,
			`FOR TABLE public.outbox WHERE (` + shard.Filter("k", 0, 2) + `) WITH (publish = 'delete')`, "reached no slot", both},
		{"via root, two shards", "parts", `FOR TABLE public.parts WITH (publish_via_partition_root = false)`,
			`FOR TABLE public.parts WITH (publish_via_partition_root = false)`, "they are repeated", both},
		{"via root, one of two", "parts", `FOR TABLE public.parts WITH (publish_via_partition_root = false)`,
			`FOR TABLE public.parts WITH (publish_via_partition_root = true)`, "publishes its rows under each partition's name", one},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := `DROP PUBLICATION IF EXISTS outboxd_0of2; DROP PUBLICATION IF EXISTS outboxd_1of2; CREATE PUBLICATION outboxd_1of2 ` + tt.create
			if tt.other != "" {
				q += `; CREATE PUBLICATION outboxd_0of2 ` + tt.other
			}
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
			cfg := config.Config{Postgres: config.Postgres{Publication: "outboxd_1of2", Table: "public." + tt.table}, Router: config.Router{KeyColumn: "k"}}
			c := &Checker{cfg: cfg, per: []config.Config{cfg}, shard: shard.Shard{Index: 1, Count: 2}}
			_, err := c.checkShardPublication(ctx, conn)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "with outboxd stopped: "+tt.fix+".")):
				t.Errorf("checkShardPublication = %v, want %q and %q", err, tt.want, tt.fix)
			}
		})
	}
}

// Second review of issue 35 §1, S6: only undefined_column and
// undefined_function say that another table's filter is on another
// column; a cancel or a serialization failure is an error, not a pass.
func TestOtherColumn(t *testing.T) {
	for code, want := range map[string]bool{"42703": true, "42883": true, "57014": false, "40001": false} {
		if got := otherColumn(fmt.Errorf("checking: %w", &pgconn.PgError{Code: code})); got != want {
			t.Errorf("otherColumn(%s) = %v, want %v", code, got, want)
		}
	}
	if otherColumn(errors.New("connection reset")) {
		t.Error("otherColumn of an error without SQLSTATE = true")
	}
}

// Second review of issue 35 §1, S6: with several tables, a table missing
// from the shard publications is refused with the one transaction that
// adds it to every shard publication lacking it, not one shard's ADD
// TABLE. While a reshard is recorded, that transaction names the
// publications of both shard counts (third review, S2). It needs the test
// bed's Postgres.
func TestShardPublicationMissingTableAddedToEveryShard(t *testing.T) {
	for _, resharding := range []bool{false, true} {
		t.Run(fmt.Sprintf("resharding %v", resharding), func(t *testing.T) { missingTableAddedToEveryShard(t, resharding) })
	}
}

func missingTableAddedToEveryShard(t *testing.T, resharding bool) {
	ctx := context.Background()
	conn := testenv.Connect(t, "shardadd", `CREATE TABLE outbox (k text); CREATE TABLE events (k text)`)
	outbox := []shard.Table{{Schema: "public", Name: "outbox", KeyColumn: "k"}}
	events := []shard.Table{{Schema: "public", Name: "events", KeyColumn: "k"}}
	counts := []int{2}
	if resharding {
		counts = []int{2, 3}
		for _, q := range []string{shard.StateTableSQL("public"),
			`INSERT INTO public.outboxd_reshard (slot, from_shards, to_shards, phase) VALUES ('outboxd', 2, 3, 'draining')`} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	var lacks []shard.Lack
	for _, n := range counts {
		pubs, _ := shard.Names("outboxd", n)
		for i, pub := range pubs {
			if _, err := conn.Exec(ctx, shard.PublicationSQL(pub, outbox, i, n)); err != nil {
				t.Fatal(err)
			}
			lacks = append(lacks, shard.Lack{Publication: pub, I: i, N: n, Tables: events})
		}
	}
	cfg := config.Config{Postgres: config.Postgres{Publication: "outboxd_1of2", Slot: "outboxd_1of2",
		Tables: []config.TableEntry{{Name: "public.outbox"}, {Name: "public.events"}}}, Router: config.Router{KeyColumn: "k"}}
	per := []config.Config{cfg, cfg}
	per[0].Postgres.Table, per[0].Postgres.Tables = "public.outbox", nil
	per[1].Postgres.Table, per[1].Postgres.Tables = "public.events", nil
	c := &Checker{cfg: cfg, per: per, shard: shard.Shard{Index: 1, Count: 2}}
	_, err := c.checkShardPublication(ctx, conn)
	want := shard.AddLacksSQL(lacks)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "before the application first writes") {
		t.Errorf("checkShardPublication = %v, want the transaction %s, run before the application first writes the table", err, want)
	}
}
