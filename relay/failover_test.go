package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/dialtest"
	"github.com/outboxd/outboxd/internal/eos"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/wal"
)

func TestCheckFailoverVersion(t *testing.T) {
	for _, tc := range []struct {
		major    int
		version  string
		failover bool
		err      string
	}{
		{14, "14.18", true, "postgres.failover_slot is true, but Postgres 14.18 has no failover slots (they came in 17); set postgres.failover_slot: false, or upgrade Postgres"},
		{16, "16.9 (Debian 16.9-1)", true, "Postgres 16.9 (Debian 16.9-1) has no failover slots"},
		{16, "16.9", false, ""},
		{17, "17.5", true, ""},
		{18, "18.0", true, ""},
	} {
		err := checkFailoverVersion(tc.major, tc.version, tc.failover)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s, failover %v: %v, want %q", tc.version, tc.failover, err, tc.err)
		}
	}
}

// TestReplacedWhy: after a timeline change a running outboxd resumes only
// from a synchronised copy no further than it confirmed.
func TestReplacedWhy(t *testing.T) {
	synced := wal.SlotInfo{Synced: true, Failover: true, ConfirmedFlushLSN: 0x3000060}
	fresh := wal.SlotInfo{ConfirmedFlushLSN: 0x5000000}
	for _, tc := range []struct {
		name       string
		saved, tli int
		info       wal.SlotInfo
		confirmed  wal.LSN
		want       string
	}{
		{"same timeline", 1, 1, fresh, 0x3000000, ""},
		{"first start", 0, 2, fresh, 0, ""},
		{"synced copy behind", 1, 2, synced, 0x3000100, ""},
		{"synced copy at", 1, 2, synced, 0x3000060, ""},
		{"synced copy, position unknown", 1, 2, synced, 0, ""},
		{"created after the promotion", 1, 2, fresh, 0x3000000, "not a synchronised copy of the one outboxd used: it was created after the promotion, at 0/5000000"},
		{"synced copy ahead", 1, 2, synced, 0x3000000, "at 0/3000060, past the last position outboxd confirmed (0/3000000)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := replacedWhy(tc.saved, tc.tli, tc.info, tc.confirmed)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("replacedWhy = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestStandbyDropsConfirmedBound: a process that sees the slot held by
// another, or past what it confirmed, no longer judges a synchronised copy
// by its own old position (issue 32 item 8): the active instance confirmed
// past it, and the copy is lawfully further.
func TestStandbyDropsConfirmedBound(t *testing.T) {
	for _, tc := range []struct {
		name string
		info wal.SlotInfo
		want wal.LSN
	}{
		{"its own, released", wal.SlotInfo{ConfirmedFlushLSN: 0x3000000}, 0x3000000},
		{"behind its own", wal.SlotInfo{ConfirmedFlushLSN: 0x2000000}, 0x3000000},
		{"held by another", wal.SlotInfo{Active: true, ConfirmedFlushLSN: 0x3000000}, 0},
		{"advanced by another", wal.SlotInfo{ConfirmedFlushLSN: 0x3000100}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Relay{confirmed: 0x3000000}
			r.sawSlot(tc.info)
			if r.confirmed != tc.want {
				t.Errorf("bound %s, want %s", r.confirmed, tc.want)
			}
			// After the promotion the copy is past the old bound: used
			// when the bound was dropped, refused when it is this
			// process's own.
			copyAhead := wal.SlotInfo{Synced: true, Failover: true, ConfirmedFlushLSN: 0x5000000}
			why := replacedWhy(1, 2, copyAhead, r.confirmed)
			if (why == "") != (tc.want == 0) {
				t.Errorf("replacedWhy with bound %s = %q", r.confirmed, why)
			}
		})
	}
}

// TestSplitBrainRefusal: a server on an older timeline than one outboxd saw
// is refused, and the message says what it is (the old primary) and what
// to do (fence it or take it out of the DSN), not that a standby was
// promoted or that a slot should be created (issue 32 item 9).
func TestSplitBrainRefusal(t *testing.T) {
	r := &Relay{newest: 2, newestAt: "10.0.0.2:5432"}
	if err := r.refuseOlderTimeline("10.0.0.1:5432", "", 2); err != nil {
		t.Errorf("same timeline refused: %v", err)
	}
	if err := r.refuseOlderTimeline("10.0.0.1:5432", "", 3); err != nil {
		t.Errorf("later timeline refused: %v", err)
	}
	for _, err := range []error{
		&SplitBrainError{Server: "10.0.0.1:5432", Timeline: 1, Newer: "10.0.0.2:5432", Seen: 2},
		refuseNewerPrimary("10.0.0.1:5432", "", 1, []pg.Primary{{Addr: "10.0.0.1:5432", Timeline: 1}, {Addr: "10.0.0.2:5432", Timeline: 2, Standby: true}}),
	} {
		if err == nil {
			t.Fatal("no refusal")
		}
		msg := err.Error()
		for _, want := range []string{"split brain", "timeline 1", "timeline 2", "10.0.0.2:5432", "old primary", "Fence it", "take it out of postgres.dsn"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%q lacks %q", msg, want)
			}
		}
		for _, wrong := range []string{"promoted to", "create the slot", "pg_create_logical_replication_slot"} {
			if strings.Contains(msg, wrong) {
				t.Errorf("%q says %q", msg, wrong)
			}
		}
		if IsPermanent(err) || SlotGone(err) {
			t.Errorf("%v: permanent %v, slot gone %v; want it retried (once fenced, the next run reaches the new primary)", err, IsPermanent(err), SlotGone(err))
		}
	}
	if err := refuseNewerPrimary("10.0.0.1:5432", "", 2, []pg.Primary{{Addr: "10.0.0.1:5432", Timeline: 1}, {Addr: "10.0.0.3:5432", Timeline: 2, Standby: true}}); err != nil {
		t.Errorf("no newer primary, refused: %v", err)
	}
	if err := refuseNewerPrimary("10.0.0.1:5432", "", 1, []pg.Primary{{Addr: "10.0.0.3:5432", Timeline: 2, Standby: true}}); err == nil ||
		!strings.Contains(err.Error(), "postgres.standby_dsns") {
		t.Errorf("a standby_dsns host that is a primary on a later timeline: %v, want split brain naming standby_dsns", err)
	}
}

// TestSplitBrainSameCluster: timelines are compared only within one
// database cluster (system identifier): after a pg_upgrade (a new cluster
// on timeline 1, Postgres 17 keeping the slot) or beside a standby_dsns
// host of another cluster on a later timeline, nothing is split brain. An
// unknown identifier ("") is taken for the same cluster (review of issue
// 32 item 9, finding 4).
func TestSplitBrainSameCluster(t *testing.T) {
	const a, b = "7300000000000000001", "7400000000000000002"
	for _, c := range []struct {
		name           string
		seenSys        string
		seen           int
		system         string
		tli            int
		others         []pg.Primary
		refused, newer bool // by refuseOlderTimeline, by refuseNewerPrimary
	}{
		{"same cluster, older timeline", a, 3, a, 1, nil, true, false},
		{"unknown identifier, older timeline", a, 3, "", 1, nil, true, false},
		{"upgraded cluster on timeline 1", a, 3, b, 1, nil, false, false},
		{"newer primary of the same cluster", "", 0, a, 1, []pg.Primary{{Addr: "10.0.0.2:5432", Timeline: 2, System: a}}, false, true},
		{"newer primary, identifier unknown", "", 0, a, 1, []pg.Primary{{Addr: "10.0.0.2:5432", Timeline: 2}}, false, true},
		{"standby_dsns host of another cluster", "", 0, a, 1, []pg.Primary{{Addr: "10.0.0.3:5432", Timeline: 5, System: b, Standby: true}}, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &Relay{newest: c.seen, newestAt: "10.0.0.2:5432", newestSystem: c.seenSys}
			if err := r.refuseOlderTimeline("10.0.0.1:5432", c.system, c.tli); (err != nil) != c.refused {
				t.Errorf("refuseOlderTimeline: %v, want refused %v", err, c.refused)
			}
			if err := refuseNewerPrimary("10.0.0.1:5432", c.system, c.tli, c.others); (err != nil) != c.newer {
				t.Errorf("refuseNewerPrimary: %v, want refused %v", err, c.newer)
			}
		})
	}
	// Once the upgraded cluster is seen, its timelines are the ones that
	// count: the old cluster's timeline 3 no longer refuses its timeline 1,
	// and the old cluster back on timeline 3 is another cluster again.
	r := &Relay{newest: 3, newestAt: "10.0.0.2:5432", newestSystem: a}
	r.sawTimeline("10.0.0.1:5432", b, 1)
	if r.newest != 1 || r.newestSystem != b {
		t.Errorf("after the upgraded cluster: newest %d of %q, want 1 of %q", r.newest, r.newestSystem, b)
	}
	if err := r.refuseOlderTimeline("10.0.0.1:5432", b, 1); err != nil {
		t.Errorf("the upgraded cluster refused: %v", err)
	}
}

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
	dsn := os.Getenv("OUTBOXD_TEST_PG_DSN")
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("OUTBOXD_TEST_PG_DSN is not set")
		}
		t.Skip("OUTBOXD_TEST_PG_DSN is not set; start scripts/testbed/pg-start and source its env")
	}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
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
				in = &streamError{in}
			}
			got := tc.r.explain(ctx, in, "")
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
// its events (the catalogue lookups of outboxTables, the slot's position
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
	tables := newOutboxTables(cfg.Postgres, r.log, 0, func(uint32, uint32) {})
	tables.db.Addr = at
	defer tables.close()
	read, closeRead := r.slotPosition(&pg.Lazy{PG: cfg.Postgres, Addr: at})
	defer closeRead()
	gone := &pgconn.PgError{Code: "42704"}
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"catalogue lookup", func() error { _, _, err := tables.lookup(ctx, 16400); return err }},
		{"column types", func() error {
			return tables.resolveTypes(ctx, &wal.Relation{Namespace: "public", Name: "outbox", Columns: []wal.Column{{Name: "c", TypeOID: 16500}}})
		}},
		{"slot position", func() error { _, err := read(ctx); return err }},
		{"exactly-once timeline", func() error { _, err := r.positionOnServer(ctx, eos.Position{LSN: 1, Timeline: 1}, "", at); return err }},
		{"judgeGone", func() error {
			if got := r.explain(ctx, gone, at); got != error(gone) {
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
