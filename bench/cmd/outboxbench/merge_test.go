package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSectionOfEveryWorkload fails when a workload the plan measures
// belongs to no section: bench/run merge could not place its results.
func TestSectionOfEveryWorkload(t *testing.T) {
	names := []string{"catchup-100tx", "catchup-1tx", "catchup-100tx-delete", "catchup-100tx-4KB", "catchup-100tx-64KB",
		"live-250B", "idle", "shards-1", "shards-4", "shard-alone-1/2", "shard-alone-0",
		backfillWorkload, multitableAlone, multitableBusy, replayLiveAlone, replayLiveBeside, replayWorkload}
	for _, w := range costWorkloads(1000000) {
		names = append(names, w.name)
	}
	// And every workload of the cited run.
	rs, err := readResults([]string{"../../results/latest/results-full.jsonl"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		names = append(names, r.Workload)
	}
	for _, n := range names {
		if sectionOf(n) == "" {
			t.Errorf("workload %q belongs to no section", n)
		}
	}
	for n, want := range map[string]string{replayLiveAlone: "replay", "live-250B": "live", "catchup-100tx-4KB": "sizes", "cost-topics-10": "cost"} {
		if got := sectionOf(n); got != want {
			t.Errorf("sectionOf(%q) = %q, want %q", n, got, want)
		}
	}
}

func resultLine(workload, label string) string {
	return fmt.Sprintf(`{"label":%q,"workload":%q,"mode":"catchup","events":1}`+"\n", label, workload)
}

func writePart(t *testing.T, machine string, lines ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "results-full.jsonl"), []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "machine-full.txt"), []byte(machine), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestMergeParts: each section comes whole from the last part that
// measured it, a merge that misses a section is refused by name, and the
// machine file names every part's sections and build.
func TestMergeParts(t *testing.T) {
	old := writePart(t, "date: 2026-11-27T04:09:06Z\noutboxd: aaa\npostgres: 17.11\nload at start: 1 1 1\n",
		resultLine("catchup-100tx", "old"), resultLine("live-250B", "old"), resultLine("idle", "old"))
	live := writePart(t, "date: 2026-11-28T10:00:00Z\noutboxd: bbb\npostgres: 17.11\nload at start: 2 2 2\n",
		resultLine("live-250B", "new"), resultLine("live-250B", "new2"))
	var parts []mergePart
	for _, d := range []string{old, live} {
		p, err := readPart(d)
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, p)
	}
	lines, machine, err := mergeParts(parts, []string{"catchup", "live", "idle"})
	if err != nil {
		t.Fatal(err)
	}
	got := string(lines)
	if strings.Contains(got, `"label":"old","workload":"live-250B"`) || !strings.Contains(got, `"label":"new2"`) ||
		!strings.Contains(got, `"workload":"catchup-100tx"`) || !strings.Contains(got, `"workload":"idle"`) {
		t.Errorf("merged lines:\n%s", got)
	}
	if !strings.Contains(machine, "sections: catchup, idle\n") ||
		!strings.Contains(machine, "part 2: live on 2026-11-28T10:00:00Z with outboxd bbb, Postgres 17.11, load 2 2 2 at the start\n") {
		t.Errorf("machine:\n%s", machine)
	}
	run := newRun(nil, machine)
	if s := run.setting(); !strings.Contains(s, "Run of 2026-11-27 (catchup, idle)") || !strings.Contains(s, "Then live on 2026-11-28") {
		t.Errorf("setting: %s", s)
	}

	_, _, err = mergeParts(parts, []string{"catchup", "live", "shards", "cost"})
	if err == nil || !strings.Contains(err.Error(), "no part measured shards, cost") || !strings.Contains(err.Error(), "bench/run full shards cost") {
		t.Errorf("a missing section: %v", err)
	}
	small := t.TempDir()
	if err := os.WriteFile(filepath.Join(small, "results-small.jsonl"), []byte(resultLine("live-250B", "x")), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readPart(small); err == nil || !strings.Contains(err.Error(), "small run") {
		t.Errorf("a small run: %v", err)
	}
}
