package relay

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
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
			got := tc.f.notes("outboxd")
			if len(got) != len(tc.want) {
				t.Fatalf("%d notes, want %d: %+v", len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				if got[i].warn != w.warn || !strings.Contains(got[i].text, w.text) {
					t.Errorf("note %d = %+v, want warn %v and %q", i, got[i], w.warn, w.text)
				}
			}
		})
	}
	if !synced.Usable() {
		t.Error("a synced, persisted copy is not usable")
	}
}

// TestWriteTextFailover: outboxd status prints each failover note on a
// row of its own.
func TestWriteTextFailover(t *testing.T) {
	rep := Report{Slot: "outboxd", SlotExists: true, Plugin: "pgoutput", WALStatus: "reserved",
		FailoverNotes: []string{"failover slot: standbys with sync_replication_slots = on keep a copy of it", "warning: standby s1 ..."}}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"\nfailover     failover slot: standbys", "\nfailover     warning: standby s1 ...\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestHosts(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://u@db:5433/app", "db:5433"},
		{"postgres://u@a:1,b:2/app?target_session_attrs=read-write", "a:1,b:2"},
		{"host=a,b port=5432 user=u target_session_attrs=read-write", "a:5432,b:5432"},
		{"postgres://u@[::1]:5432/app", "[::1]:5432"},
	} {
		cfg, err := pgconn.ParseConfig(tc.dsn)
		if err != nil {
			t.Fatal(err)
		}
		if got := hosts(cfg); got != tc.want {
			t.Errorf("hosts(%s) = %s, want %s", tc.dsn, got, tc.want)
		}
	}
}

// TestConnectTriesEveryHost: a first host that accepts and never answers
// (a tarpit) does not keep the second from being tried, when the DSN sets
// no connect_timeout.
func TestConnectTriesEveryHost(t *testing.T) {
	defer func(d time.Duration) { hostConnectTimeout = d }(hostConnectTimeout)
	hostConnectTimeout = time.Second
	tarpit, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tarpit.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := tarpit.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}()
	second, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	reached := make(chan struct{}, 16)
	go func() {
		for {
			c, err := second.Accept()
			if err != nil {
				return
			}
			reached <- struct{}{}
			c.Close() // answers by hanging up: a failed attempt, but an attempt
		}
	}()
	dsn := fmt.Sprintf("postgres://u@%s,%s/app?sslmode=disable", tarpit.Addr(), second.Addr())
	r := &Relay{cfg: config.Config{Postgres: config.Postgres{DSN: dsn, Slot: "outboxd"}}, log: slog.New(slog.DiscardHandler)}
	for name, connect := range map[string]func(context.Context) error{
		"regular": func(ctx context.Context) error {
			_, err := Connect(ctx, r.cfg.Postgres)
			return err
		},
		"replication": func(ctx context.Context) error {
			_, err := r.connectReplication(ctx)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			for len(reached) > 0 {
				<-reached
			}
			err := connect(context.Background())
			if err == nil {
				t.Fatal("connected")
			}
			select {
			case <-reached:
			default:
				t.Fatalf("the second host was never tried: %v", err)
			}
			if want := tarpit.Addr().String() + "," + second.Addr().String(); !strings.Contains(err.Error(), want) {
				t.Errorf("%v does not name %s", err, want)
			}
		})
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
