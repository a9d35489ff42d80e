package pg

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/dialtest"
	"github.com/outboxd/outboxd/internal/testenv"
)

// TestFailoverNotes: what the start-up check logs and outboxd status shows
// for each failover state, and which lines are warnings.
func TestFailoverNotes(t *testing.T) {
	synced := SlotCopy{Standby: "10.0.0.2:5432", InRecovery: true, SyncSlots: true, Exists: true, Synced: true, Confirmed: "0/3000060"}
	type want struct {
		warn bool
		text string // a substring of the note
	}
	for _, tc := range []struct {
		name string
		f    Failover
		want []want
	}{
		{"17, no slot on timeline 2", Failover{Major: 17, Timeline: 2},
			[]want{{true, "the slot does not exist and this server is on timeline 2 (promoted from a standby or restored from a backup), where outboxd does not create it"}}},
		{"17, no slot on timeline 1", Failover{Major: 17, Timeline: 1}, nil},
		{"16, a standby a primary on a later timeline", Failover{Major: 16, Timeline: 1, SlotExists: true, Copies: []SlotCopy{{Standby: "10.0.0.2:5432", Timeline: 2}}},
			[]want{{false, "not a failover slot"}, {true, "split brain: standby 10.0.0.2:5432 is a primary on timeline 2, later than this server's 1: this server is the old primary; fence it"}}},
		{"17, a standby a primary on a later timeline", Failover{Major: 17, Timeline: 1, SlotExists: true, SlotFailover: true, Copies: []SlotCopy{{Standby: "10.0.0.2:5432", Timeline: 2}}},
			[]want{{false, "failover slot"}, {true, "split brain: standby 10.0.0.2:5432 is a primary on timeline 2"}}},
		{"16, no standby", Failover{Major: 16, SlotExists: true},
			[]want{{false, "not a failover slot: Postgres 16 has none (they came in 17)"}}},
		{"16 with a standby", Failover{Major: 16, SlotExists: true, Standbys: []Standby{{Name: "s1", Slot: "s1"}}},
			[]want{{false, "a promoted standby has no copy of slot \"outboxd\" and outboxd stops there"}, {false, "standby s1 streams through slot s1"}}},
		{"17, option off, no standby", Failover{Major: 17, SlotExists: true},
			[]want{{false, "not a failover slot (postgres.failover_slot: false)"}}},
		{"17, option off, a standby", Failover{Major: 17, SlotExists: true, Standbys: []Standby{{Name: "s1", Slot: "s1"}}},
			[]want{{true, "set postgres.failover_slot: true"}, {false, "standby s1 streams through slot s1"}}},
		{"17, all set", Failover{Major: 17, SlotExists: true, SlotFailover: true, Confirmed: 0x3000060,
			SynchronizedStandbySlots: []string{"s1"}, Standbys: []Standby{{Name: "s1", Slot: "s1", Synchronized: true}}, Copies: []SlotCopy{synced}},
			[]want{{false, "failover slot: standbys with sync_replication_slots = on keep a copy"},
				{false, "which synchronized_standby_slots names"},
				{false, "standby 10.0.0.2:5432 holds a synchronised copy of slot \"outboxd\" at 0/3000060 (here 0/3000060)"}}},
		{"17, slot not named", Failover{Major: 17, SlotExists: true, SlotFailover: true, SynchronizedStandbySlots: []string{"other"},
			Standbys: []Standby{{Name: "s1", Slot: "s1"}, {Name: "other", Slot: "other", Synchronized: true}}},
			[]want{{false, "failover slot"}, {true, "synchronized_standby_slots does not name standby s1's slot s1"},
				{false, "standby other streams through slot other"}}},
		{"17, named slot unused", Failover{Major: 17, SlotExists: true, SlotFailover: true, SynchronizedStandbySlots: []string{"gone"}, UnusedSynchronized: []string{"gone"}},
			[]want{{false, "failover slot"}, {true, "synchronized_standby_slots names gone, which no standby streams from"}}},
		{"17, standby without a slot", Failover{Major: 17, SlotExists: true, SlotFailover: true, Standbys: []Standby{{Name: "s1"}}},
			[]want{{false, "failover slot"}, {true, "standby s1 streams without a replication slot"}}},
		{"17, copies not usable", Failover{Major: 17, SlotExists: true, SlotFailover: true, Copies: []SlotCopy{
			{Standby: "a:1", Err: "connection refused"},
			{Standby: "b:1", InRecovery: false},
			{Standby: "c:1", InRecovery: true},
			{Standby: "d:1", InRecovery: true, SyncSlots: true},
			{Standby: "e:1", InRecovery: true, SyncSlots: true, Exists: true, Synced: true, Temporary: true},
			{Standby: "f:1", InRecovery: true, SyncSlots: true, Exists: true, Synced: true, Confirmed: "0/1", Invalidation: "wal_removed"},
		}}, []want{{false, "failover slot"}, {true, "a:1: cannot read its copy of the slot: connection refused"}, {true, "b:1 is not in recovery"},
			{true, "c:1 has sync_replication_slots off"}, {true, "d:1 holds no copy of slot"}, {true, "e:1's copy of slot \"outboxd\" is not persisted yet"},
			{true, "f:1's copy of slot \"outboxd\" is invalidated (wal_removed)"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.f.Notes("outboxd")
			if len(got) != len(tc.want) {
				t.Fatalf("%d notes, want %d: %+v", len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				if got[i].Warn != w.warn || !strings.Contains(got[i].Text, w.text) {
					t.Errorf("note %d = %+v, want warn %v and %q", i, got[i], w.warn, w.text)
				}
			}
		})
	}
	if !synced.Usable() {
		t.Error("a synced, persisted copy is not usable")
	}
}

// TestPrimariesOneHost: a DSN of one host (which sslmode=prefer lists
// twice, with TLS and without) and no standby DSNs has nothing to compare:
// Primaries dials nothing.
func TestPrimariesOneHost(t *testing.T) {
	l := dialtest.Listen(t, "tcp", "127.0.0.1:0")
	pg := config.Default().Postgres
	pg.DSN = "postgres://postgres@" + l.Addr() + "/postgres?sslmode=prefer"
	if got := Primaries(context.Background(), pg, time.Second); got != nil || l.Accepted() != 0 {
		t.Errorf("Primaries = %v after %d dials, want nothing and none", got, l.Accepted())
	}
	pg.DSN = fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=prefer", l.Addr(), l.Addr())
	if got := Primaries(context.Background(), pg, time.Second); got != nil || l.Accepted() != 0 {
		t.Errorf("the same host twice: Primaries = %v after %d dials, want nothing and none", got, l.Accepted())
	}
}

// TestPrimariesStandbyDSNs: each host of a standby DSN is asked on its own,
// whatever the DSN's target_session_attrs: a promoted standby, writable now,
// is the host to compare with, and target_session_attrs=standby used to
// leave it out; a DSN of several hosts used to be asked about its first
// reachable one only (review of issue 32 item 9, finding 7). It needs the
// test bed's Postgres (OUTBOXD_TEST_PG_DSN), a primary.
func TestPrimariesStandbyDSNs(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(int(cfg.Port))
	pg := config.Default().Postgres
	pg.DSN = dsn
	pg.StandbyDSNs = []string{
		"postgres://postgres@127.0.0.1:" + port + "/postgres?sslmode=disable&target_session_attrs=standby",
		"postgres://postgres@localhost:" + port + ",127.0.0.1:" + port + "/postgres?sslmode=disable&target_session_attrs=read-only",
	}
	got := Primaries(context.Background(), pg, 5*time.Second)
	var standbys []string
	for _, p := range got {
		if p.Standby {
			standbys = append(standbys, p.Addr)
		}
		if p.System == "" {
			t.Errorf("%s: no system identifier", p.Addr)
		}
	}
	if len(standbys) != 3 {
		t.Errorf("standby_dsns hosts found primary: %v, want 127.0.0.1:%s twice and localhost:%[2]s", standbys, port)
	}
}
