package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/dialtest"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/internal/preflight"
	"github.com/outboxd/outboxd/internal/tables"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/wal"
)

// TestDecisionsByCode: the permanent-or-retry and slot-gone decisions read
// the SQLSTATE and the error's own type, never the message, which is in the
// server's language (issue 32 item 18). A server's 42704 or 55000 is not a
// gone slot by itself: explain reads the catalogue (TestJudgeGoneReadsCatalogue).
func TestDecisionsByCode(t *testing.T) {
	for _, tc := range []struct {
		name            string
		err             error
		permanent, gone bool
	}{
		{"slot missing, French", &pgconn.PgError{Code: "42704", Message: "le slot de réplication « outboxd » n'existe pas"}, false, false},
		{"slot missing, English", &pgconn.PgError{Code: "42704", Message: `replication slot "outboxd" does not exist`}, false, false},
		{"slot invalidated, German", &pgconn.PgError{Code: "55000", Message: "kann keine Änderungen mehr aus Replikations-Slot »outboxd« lesen"}, false, false},
		{"password, Japanese", &pgconn.PgError{Code: "28P01", Message: "ユーザー\"outboxd\"のパスワード認証に失敗しました"}, true, false},
		{"privilege, Spanish", &pgconn.PgError{Code: "42501", Message: "permiso denegado"}, true, false},
		{"connection lost", &pgconn.PgError{Code: "57P01", Message: "Verbindung wird abgebrochen"}, false, false},
		{"outboxd's missing slot", fmt.Errorf("inspecting: %w", wal.Errorf(wal.ErrSlotMissing, "slot gone")), true, true},
		{"outboxd's lost slot", wal.Errorf(wal.ErrSlotLost, "slot invalidated"), true, true},
		{"outboxd's missing publication", wal.Errorf(wal.ErrPublicationMissing, "publication gone"), true, false},
		// Retried: once the old primary is fenced, the next run reaches the new one.
		{"split brain", &preflight.SplitBrainError{Server: "10.0.0.1:5432", Timeline: 1, Newer: "10.0.0.2:5432", Seen: 2}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsPermanent(tc.err); got != tc.permanent {
				t.Errorf("IsPermanent(%v) = %v, want %v", tc.err, got, tc.permanent)
			}
			if got := SlotGone(tc.err); got != tc.gone {
				t.Errorf("SlotGone(%v) = %v, want %v", tc.err, got, tc.gone)
			}
		})
	}
}

// TestJudgeGoneReadsCatalogue: a server error with the SQLSTATE of a gone
// slot or publication is decided by a fresh read of pg_replication_slots,
// whatever its message says and in whatever language (issue 32 item 18).
// It needs the test bed's Postgres (OUTBOXD_TEST_PG_DSN).
func TestJudgeGoneReadsCatalogue(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(ctx) }) // after the slot is dropped: a deferred Close left it behind
	slot := fmt.Sprintf("judge_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot) })

	relay := func(slot, dsn string) *Relay {
		cfg := config.Default()
		cfg.Postgres.DSN, cfg.Postgres.Slot, cfg.Postgres.Publication = dsn, slot, "outboxd_judge"
		r, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	slotText := func(name string) string { return fmt.Sprintf("le slot de réplication « %s » n'existe pas", name) }
	for _, tc := range []struct {
		name            string
		r               *Relay
		err             *pgconn.PgError
		gone, permanent bool
		is              error // the sentinel the decision gives, nil for the server's error as it was
	}{
		{"slot missing, French", relay("judge_missing", dsn), &pgconn.PgError{Code: "42704", Message: slotText("judge_missing")}, true, true, wal.ErrSlotMissing},
		{"slot missing, text of a publication", relay("judge_missing", dsn), &pgconn.PgError{Code: "42704", Message: `publication "x" does not exist`}, true, true, wal.ErrSlotMissing},
		{"slot there, publication undefined", relay(slot, dsn), &pgconn.PgError{Code: "42704", Message: slotText(slot)}, false, true, wal.ErrPublicationMissing},
		{"slot there, 42704 not from the stream", relay(slot, dsn), &pgconn.PgError{Code: "42704", Message: slotText(slot)}, false, false, nil},
		{"slot there and valid, 55000", relay(slot, dsn), &pgconn.PgError{Code: "55000", Message: `can no longer get changes from replication slot "` + slot + `"`}, false, false, nil},
		{"other code", relay("judge_missing", dsn), &pgconn.PgError{Code: "57P01", Message: slotText("judge_missing")}, false, false, nil},
		{"catalogue unreadable", relay("judge_missing", "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=1"), &pgconn.PgError{Code: "42704", Message: slotText("judge_missing")}, false, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var in error = fmt.Errorf("slot %q: %w", tc.r.cfg.Postgres.Slot, tc.err)
			if !strings.Contains(tc.name, "not from the stream") {
				in = &preflight.StreamError{Err: in}
			}
			got := tc.r.explain(ctx, in, "", &preflight.History{})
			if SlotGone(got) != tc.gone || IsPermanent(got) != tc.permanent {
				t.Errorf("explain(%v) = %v: slot gone %v, permanent %v; want %v, %v", in, got, SlotGone(got), IsPermanent(got), tc.gone, tc.permanent)
			}
			if tc.is == nil && got != in || tc.is != nil && !errors.Is(got, tc.is) {
				t.Errorf("explain(%v) = %v, want %v", in, got, tc.is)
			}
		})
	}
}

// TestRunConnectionsPinned: every connection of a run that decides about
// its events (the catalogue lookups of tables.Outbox, the slot's position
// for Close, the exactly-once position's timeline, judgeGone's fresh read)
// dials the server the run streams from and never another host of
// postgres.dsn, even one that accepts (an old primary back writable,
// listed first; review of issue 32 item 9, finding 3). The listeners are
// not Postgres: each attempt fails after the dial.
func TestRunConnectionsPinned(t *testing.T) {
	other, run := dialtest.Listen(t, "tcp", "127.0.0.1:0"), dialtest.Listen(t, "tcp", "127.0.0.1:0")
	addrs := [2]string{other.Addr(), run.Addr()}
	cfg := config.Default()
	cfg.Postgres.DSN = fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&connect_timeout=1", addrs[0], addrs[1])
	r, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	at := "tcp " + addrs[1]
	ctx := context.Background()
	outbox := tables.New(cfg.Postgres, []config.Config{cfg}, nil, r.log, at, func(int, uint32, uint32) error { return nil }, nil)
	defer outbox.Close()
	read, closeRead := r.slotPosition(&pg.Lazy{PG: cfg.Postgres, Addr: at})
	defer closeRead()
	gone := &pgconn.PgError{Code: "42704"}
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"catalogue lookup", func() error {
			_, _, err := outbox.Which(ctx, &wal.Relation{ID: 16400, Namespace: "public", Name: "other"})
			return err
		}},
		{"column types", func() error {
			_, _, err := outbox.Which(ctx, &wal.Relation{Namespace: "public", Name: "outbox", Columns: []wal.Column{{Name: "c", TypeOID: 16500}}})
			return err
		}},
		{"slot position", func() error { _, err := read(ctx); return err }},
		// A reshard reads an old shard's timeline on the connections of
		// the ReplicationAt that Shards.delivered gives delivery.OldShard.
		{"exactly-once timeline", func() error {
			repl, err := r.check.ReplicationAt(ctx, at)
			if err == nil {
				repl.Close(ctx)
			}
			return err
		}},
		{"judgeGone", func() error {
			if got := r.explain(ctx, gone, at, &preflight.History{}); got != error(gone) {
				return fmt.Errorf("explain = %v, want the server's error as it was (the catalogue is unreadable)", got)
			}
			return errors.New("unreadable")
		}},
	} {
		elsewhere, before := other.Accepted(), run.Accepted()
		if err := c.call(); err == nil {
			t.Errorf("%s: connected to a listener that is not Postgres", c.name)
		}
		if n := other.Accepted() - elsewhere; n != 0 {
			t.Errorf("%s: the other host was dialled %d times; want never", c.name, n)
		}
		if run.Accepted() == before {
			t.Errorf("%s: the run's server was never dialled", c.name)
		}
	}
}
