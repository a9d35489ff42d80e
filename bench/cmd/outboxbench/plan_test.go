package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestShardCount(t *testing.T) {
	for c, want := range map[string]int{"outboxd_s2": 2, "outboxd_s16": 16, "outboxd": 0, "outboxd_eos": 0, "outboxd_sx": 0} {
		if got := shardCount(c); got != want {
			t.Errorf("shardCount(%s) = %d, want %d", c, got, want)
		}
	}
}

func TestOutboxdCmd(t *testing.T) {
	p := plan{dsn: "postgres://x", brokers: "127.0.0.1:1", outboxd: "/bin/a", outboxdB: "/bin/b",
		outboxdEnv: "GOMAXPROCS=1", outboxdEnvB: "GOMAXPROCS=2", unsetBench: []string{"-u", "OUTBOXD_BENCH_EVENTS"}}
	for _, tc := range []struct {
		c, bin string
		want   []string // words the command holds
		not    []string
	}{
		{"outboxd", "/bin/a", []string{"GOMAXPROCS=1", "OUTBOXD_POSTGRES_SLOT=s"}, []string{"OUTBOXD_KAFKA_DELIVERY=exactly_once"}},
		{"outboxd_b", "/bin/b", []string{"GOMAXPROCS=2"}, []string{"GOMAXPROCS=1"}},
		{"outboxd_eos", "/bin/a", []string{"OUTBOXD_KAFKA_DELIVERY=exactly_once", "GOMAXPROCS=1"}, nil},
		{"outboxd_s4", "/bin/a", []string{"OUTBOXD_POSTGRES_SHARDS=4"}, nil},
	} {
		argv := p.outboxdCmd(tc.c, "s")
		if argv[0] != "env" || argv[len(argv)-1] != tc.bin {
			t.Errorf("%s: %v does not run %s through env", tc.c, argv, tc.bin)
		}
		if !slices.Contains(argv, "OUTBOXD_BENCH_EVENTS") {
			t.Errorf("%s: %v leaves the harness's variables to outboxd, which rejects them", tc.c, argv)
		}
		checkWords(t, tc.c, argv, tc.want, tc.not)
		if exactlyOnce(argv) != (tc.c == "outboxd_eos") {
			t.Errorf("%s: exactlyOnce = %v", tc.c, exactlyOnce(argv))
		}
	}
}

// checkWords checks that a command line holds the words want and none of not.
func checkWords(t *testing.T, name string, argv, want, not []string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(argv, w) {
			t.Errorf("%s: %v lacks %s", name, argv, w)
		}
	}
	for _, w := range not {
		if slices.Contains(argv, w) {
			t.Errorf("%s: %v has %s", name, argv, w)
		}
	}
}

func TestPeerCmd(t *testing.T) {
	p := plan{dir: t.TempDir(), dsn: "postgres://x", brokers: "127.0.0.1:1", pgPort: "5", gopqcdc: "/bin/g", conduit: "/bin/c"}
	argv, err := p.peerCmd("go_pq_cdc_kafka", "s")
	if err != nil || argv[0] != "/bin/g" || !slices.Contains(argv, "s") {
		t.Errorf("go_pq_cdc_kafka: %v, %v", argv, err)
	}
	argv, err = p.peerCmd("conduit", "s")
	if err != nil || !slices.Contains(argv, "/bin/c") {
		t.Fatalf("conduit: %v, %v", argv, err)
	}
	y, err := os.ReadFile(filepath.Join(p.dir, "runs", "conduit-s", "pipeline.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`printf "%s-events" (index .Payload.After "aggregate_type")`, "logrepl.slotName: s", "servers: 127.0.0.1:1", "field: .Key"} {
		if !strings.Contains(string(y), want) {
			t.Errorf("pipeline lacks %q:\n%s", want, y)
		}
	}
	if _, err := p.peerCmd("nosuch", "s"); err == nil {
		t.Error("no error for an unknown peer")
	}
}

func TestCatchupSlot(t *testing.T) {
	if got := catchupSlot("catchup_100tx", "outboxd", 1); got != "bench_catchup_100tx_outboxd" {
		t.Errorf("first repeat: %s", got)
	}
	if got := catchupSlot("catchup_100tx", "outboxd", 3); got != "bench_catchup_100tx_outboxd_r3" {
		t.Errorf("third repeat: %s", got)
	}
}
