package replay

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
)

func TestOptionsCheck(t *testing.T) {
	ok := Options{Where: "true", Batch: 1, Progress: time.Second}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		err  string
	}{
		{"valid", func(*Options) {}, ""},
		{"no where", func(o *Options) { o.Where = "" }, "-where is empty"},
		{"resume needs no where", func(o *Options) { o.Where, o.Resume = "", "r1" }, ""},
		{"resume checks a where given", func(o *Options) { o.Where, o.Resume = "a)", "r1" }, "closes a parenthesis"},
		{"negative rate", func(o *Options) { o.Rate = -1 }, "-rate -1"},
		{"no batch", func(o *Options) { o.Batch = 0 }, "-batch 0"},
		{"huge batch", func(o *Options) { o.Batch = 100001 }, "-batch 100001"},
		{"bad topic", func(o *Options) { o.ToTopic = "a b" }, `-to-topic "a b"`},
		{"dot topic", func(o *Options) { o.ToTopic = ".." }, `-to-topic ".."`},
		{"good topic", func(o *Options) { o.ToTopic = "orders.replay_1-x" }, ""},
		{"no progress", func(o *Options) { o.Progress = 0 }, "-progress"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.edit(&o)
			err := o.check()
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("check() = %v, want %q", err, tc.err)
			}
		})
	}
}

func TestKeyColumns(t *testing.T) {
	outbox := table{name: "public.outbox", types: map[string]uint32{"id": 2950, "created_at": 1184, "n": 20, "payload": 3802}, primary: []string{"id"}}
	composite := table{name: "public.events", types: map[string]uint32{"tenant": 25, "seq": 20, "ts": 1184}, primary: []string{"tenant", "seq"}}
	noCreated := table{name: "public.plain", types: map[string]uint32{"id": 20}, primary: []string{"id"}}
	for _, tc := range []struct {
		name  string
		t     table
		order string
		want  []string
		err   string
	}{
		{"created_at by default", outbox, "", []string{"created_at", "id"}, ""},
		{"the column named", outbox, "n", []string{"n", "id"}, ""},
		{"the primary key named", outbox, "id", []string{"id"}, ""},
		{"primary key without created_at", noCreated, "", []string{"id"}, ""},
		{"composite primary key", composite, "ts", []string{"ts", "tenant", "seq"}, ""},
		{"a column of the primary key", composite, "seq", []string{"seq", "tenant"}, ""},
		{"no such column", outbox, "nope", nil, "-order nope: table public.outbox has no such column"},
		{"no primary key", table{name: "public.x", types: map[string]uint32{"a": 20}}, "a", nil, "has no primary key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.t.keyColumns(tc.order)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("keyColumns(%q) = %v, %v; want an error with %q", tc.order, got, err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("keyColumns(%q) = %v, %v; want %v", tc.order, got, err, tc.want)
			}
		})
	}
}

func TestSharedDefault(t *testing.T) {
	tb := table{defaults: map[string]string{"a": "now()", "b": "CURRENT_TIMESTAMP", "c": "clock_timestamp()", "d": "", "e": "transaction_timestamp()"}}
	for col, want := range map[string]bool{"a": true, "b": true, "c": false, "d": false, "e": true} {
		if got := tb.sharedDefault(col); got != want {
			t.Errorf("sharedDefault(%s) = %v, want %v", col, got, want)
		}
	}
}

func TestWhereError(t *testing.T) {
	tb := table{name: "public.outbox", types: map[string]uint32{"b": 25, "a": 25}}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"undefined column", &pgconn.PgError{Code: "42703", Message: `column "x" does not exist`, Position: 57},
			`-where "a = 1 AND x = 2" is refused by Postgres at character 11 of it: column "x" does not exist (SQLSTATE 42703); fix the clause: it is the body of a WHERE over the columns of public.outbox (a, b)`},
		{"position outside the clause", &pgconn.PgError{Code: "42601", Message: "syntax error", Position: 3},
			`-where "a = 1 AND x = 2" is refused by Postgres: syntax error (SQLSTATE 42601)`},
		{"hint", &pgconn.PgError{Code: "42883", Message: "operator does not exist", Hint: "add casts"},
			`operator does not exist (add casts) (SQLSTATE 42883)`},
		{"writes", &pgconn.PgError{Code: "25006", Message: "cannot execute nextval() in a read-only transaction"},
			`-where "a = 1 AND x = 2" writes (cannot execute nextval() in a read-only transaction): a replay reads in READ ONLY transactions`},
		{"not from the server", errors.New("conn closed"), "checking -where on public.outbox: conn closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := whereError(tc.err, "a = 1 AND x = 2", 47, tb).Error()
			if !strings.Contains(got, tc.want) {
				t.Fatalf("got\n%s\nwant it to hold\n%s", got, tc.want)
			}
		})
	}
}

func TestSummary(t *testing.T) {
	for _, tc := range []struct {
		s    Summary
		want string
	}{
		{Summary{Run: "r1", Table: "public.outbox", Sent: 10, Total: 10, Finished: true}, "replay r1 of public.outbox finished: 10 rows sent (10 matched when it started)"},
		{Summary{Run: "r1", Table: "public.outbox", Sent: 8, Total: 10, Finished: true}, "finished: 8 rows sent (10 matched when it started); at least 2 of those were deleted before the replay read them"},
		{Summary{Run: "r1", Table: "public.outbox", Sent: 4, Total: 10}, "replay r1 of public.outbox stopped: 4 of 10 rows sent; resume it with outboxd replay -resume r1"},
	} {
		if got := tc.s.String(); !strings.Contains(got, tc.want) {
			t.Errorf("got %q, want it to hold %q", got, tc.want)
		}
	}
}

func TestAwait(t *testing.T) {
	fail := errors.New("refused")
	r := &Replay{cfg: config.Config{ShutdownTimeout: 200 * time.Millisecond}}
	t.Run("all acknowledged", func(t *testing.T) {
		acks := make(chan error, 3)
		acks <- nil
		acks <- nil
		acks <- nil
		if err := r.await(context.Background(), acks, 3); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("one failed", func(t *testing.T) {
		acks := make(chan error, 3)
		acks <- nil
		acks <- fail
		acks <- errors.New("later")
		if err := r.await(context.Background(), acks, 3); !errors.Is(err, fail) {
			t.Fatalf("await = %v, want the first failure", err)
		}
	})
	t.Run("stopped, then acknowledged within shutdown_timeout", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		acks := make(chan error, 2)
		go func() {
			time.Sleep(20 * time.Millisecond)
			acks <- nil
			acks <- nil
		}()
		if err := r.await(ctx, acks, 2); err != nil {
			t.Fatalf("await = %v, want the records handed over waited for", err)
		}
	})
	t.Run("stopped, and not acknowledged", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		acks := make(chan error, 2)
		acks <- nil
		err := r.await(ctx, acks, 2)
		if err == nil || !strings.Contains(err.Error(), "1 records handed to Kafka were not acknowledged within shutdown_timeout") {
			t.Fatalf("await = %v", err)
		}
	})
}

// -table names a table of postgres.tables by its exact name, or a table a
// pattern matches, and takes the router of the entry outboxd routes it by
// (review-patterns35 M7).
func TestTableConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outboxd.yaml")
	yaml := "postgres:\n  tables:\n    - public.outbox\n    - name: tenant_*.events\n      router: {key_column: k}\n" +
		"    - name: tenant_vip.events\n      router: {key_column: v}\nrouter:\n  messages: {unowned: ignore}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ table, key string }{
		{"public.outbox", cfg.Router.KeyColumn},
		{"tenant_a.events", "k"},
		{"tenant_vip.events", "v"}, // its exact name, before the pattern
	} {
		c, err := tableConfig(cfg, tc.table)
		if err != nil || c.Postgres.Table != tc.table || c.Router.KeyColumn != tc.key {
			t.Errorf("tableConfig(%s): table %q, key column %q, %v; want key column %q", tc.table, c.Postgres.Table, c.Router.KeyColumn, err, tc.key)
		}
	}
	if _, err := tableConfig(cfg, "shop.events"); err == nil ||
		!strings.Contains(err.Error(), "-table shop.events: it is none of postgres.tables (public.outbox, tenant_vip.events, tenant_*.events)") {
		t.Errorf("a table no entry names: %v", err)
	}
}
