package preflight

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/shard"
)

// Second review of issue 35 §1, S3: a shard's publication that does not
// publish inserts (nothing reaches outboxd), or that publishes a
// partitioned outbox table under each partition's name (each partition's
// own filter, none, applies: every shard delivers its rows), is refused
// at start-up with the statement that puts it right. It needs the test
// bed's Postgres.
func TestShardPublicationOptionsChecked(t *testing.T) {
	_, dsn := testenv.NewDatabase(t, "shardopts")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox (k text, payload text);
		CREATE TABLE parts (k text, payload text) PARTITION BY LIST (k); CREATE TABLE parts_a PARTITION OF parts DEFAULT`); err != nil {
		t.Fatal(err)
	}
	fix := `run ALTER PUBLICATION "outboxd_1of2" SET (publish = 'insert', publish_via_partition_root = true)`
	tests := []struct {
		name, table, create, want string
	}{
		{"publish", "outbox", `FOR TABLE public.outbox WHERE (` + shard.Filter("k", 1, 2) + `) WITH (publish = 'update')`, "does not publish INSERTs"},
		{"via root", "parts", `FOR TABLE public.parts WITH (publish_via_partition_root = false)`, "publishes its rows under each partition's name"},
		{"right", "outbox", `FOR TABLE public.outbox WHERE (` + shard.Filter("k", 1, 2) + `) WITH (publish = 'insert')`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := conn.Exec(ctx, `DROP PUBLICATION IF EXISTS outboxd_1of2; CREATE PUBLICATION outboxd_1of2 `+tt.create); err != nil {
				t.Fatal(err)
			}
			cfg := config.Config{Postgres: config.Postgres{Publication: "outboxd_1of2", Table: "public." + tt.table}, Router: config.Router{KeyColumn: "k"}}
			c := &Checker{cfg: cfg, per: []config.Config{cfg}, shard: shard.Shard{Index: 1, Count: 2}}
			_, err := c.checkShardPublication(ctx, conn)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), fix)):
				t.Errorf("checkShardPublication = %v, want %q and %q", err, tt.want, fix)
			}
		})
	}
}
