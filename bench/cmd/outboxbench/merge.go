package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// cmdMerge assembles the run the report cites from full-size runs that
// each measured some of the sections (bench/run merge PART...), for when
// one run of every section does not fit in the time there is. Each section
// comes whole from one part: the last part named that has it. Together
// the parts must cover every section of a full run. The merged
// machine-full.txt keeps the first part's description and adds one
// "part N" line per further part (its sections, date, build, Postgres and
// load), which the report's opening paragraph repeats, so that no figure
// is cited without the build and the day that produced it.
func cmdMerge(args []string) error {
	fs := flag.NewFlagSet("merge", flag.ExitOnError)
	out, docs, withPlots := renderFlags(fs, "the merged results directory (replaced)")
	_ = fs.Parse(args)
	if fs.NArg() == 0 {
		return fmt.Errorf("name the results directories of the runs to merge (each with results-full.jsonl and machine-full.txt)")
	}
	var parts []mergePart
	for _, dir := range fs.Args() {
		p, err := readPart(dir)
		if err != nil {
			return err
		}
		parts = append(parts, p)
	}
	lines, machine, err := mergeParts(parts, fullSections())
	if err != nil {
		return err
	}
	// Every part is read: the output may be one of them.
	if err := os.RemoveAll(*out); err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "results-full.jsonl"), lines, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "machine-full.txt"), []byte(machine), 0o644); err != nil {
		return err
	}
	report := []string{"-out", *out, "-docs", *docs}
	if *withPlots {
		report = append(report, "-plots")
	}
	return cmdReport(report)
}

// fullSections are the sections a full run measures, which a merged run
// must cover too.
func fullSections() []string {
	return sizes["full"].sections
}

// mergePart is one run's results directory, read.
type mergePart struct {
	dir      string
	lines    [][]byte          // result lines, as written
	sections map[string]bool   // the sections its lines belong to
	machine  string            // machine-full.txt
	keys     map[string]string // machine-full.txt's "key: value" lines
}

func readPart(dir string) (mergePart, error) {
	p := mergePart{dir: dir, sections: map[string]bool{}, keys: map[string]string{}}
	raw, err := os.ReadFile(filepath.Join(dir, "results-full.jsonl"))
	if err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "results-small.jsonl")); serr == nil {
			return p, fmt.Errorf("%s holds a small run; the cited run is made of full-size runs only (bench/run full SECTION...)", dir)
		}
		return p, fmt.Errorf("%w (each part is the results directory of a full-size run)", err)
	}
	machine, err := os.ReadFile(filepath.Join(dir, "machine-full.txt"))
	if err != nil {
		return p, fmt.Errorf("%w: without it the run's build and machine are unknown", err)
	}
	p.machine = string(machine)
	for _, line := range strings.Split(p.machine, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			p.keys[k] = v
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Mode == "" {
			continue
		}
		s := sectionOf(r.Workload)
		if s == "" {
			return p, fmt.Errorf("%s: workload %q belongs to no known section", dir, r.Workload)
		}
		p.sections[s] = true
		p.lines = append(p.lines, append(slices.Clone(sc.Bytes()), '\n'))
	}
	if err := sc.Err(); err != nil {
		return p, fmt.Errorf("reading %s: %w", dir, err)
	}
	if len(p.lines) == 0 {
		return p, fmt.Errorf("no results in %s", dir)
	}
	return p, nil
}

// sectionOf names the section of bench/run that measures a workload.
func sectionOf(workload string) string {
	switch {
	case workload == "catchup-100tx" || workload == "catchup-1tx":
		return "catchup"
	case workload == "catchup-100tx-delete":
		return "deletes"
	case workload == "catchup-100tx-4KB" || workload == "catchup-100tx-64KB":
		return "sizes"
	case workload == replayLiveAlone || workload == replayLiveBeside || workload == replayWorkload:
		return "replay"
	case strings.HasPrefix(workload, "live-"):
		return "live"
	case workload == "idle":
		return "idle"
	case strings.HasPrefix(workload, "shards-") || strings.HasPrefix(workload, "shard-alone-"):
		return "shards"
	case strings.HasPrefix(workload, "cost-"):
		return "cost"
	case workload == backfillWorkload:
		return "backfill"
	case workload == multitableAlone || workload == multitableBusy:
		return "multitable"
	}
	return ""
}

// mergeParts takes each section's lines from the last part that has it and
// describes the parts in one machine file. It refuses a merge that leaves
// a section of want out.
func mergeParts(parts []mergePart, want []string) (lines []byte, machine string, err error) {
	from := map[string]int{} // section → part
	for i, p := range parts {
		for s := range p.sections {
			from[s] = i
		}
	}
	var missing []string
	for _, s := range want {
		if _, ok := from[s]; !ok {
			missing = append(missing, s)
		}
	}
	if len(missing) > 0 {
		return nil, "", fmt.Errorf("no part measured %s; run them at full size (bench/run full %s) and name that run's results directory too",
			strings.Join(missing, ", "), strings.Join(missing, " "))
	}
	used := map[int][]string{} // part → the sections taken from it
	for _, s := range append(slices.Clone(want), "deletes") {
		if i, ok := from[s]; ok {
			used[i] = append(used[i], s)
		}
	}
	var b bytes.Buffer
	for i, p := range parts {
		for _, line := range p.lines {
			var r result
			_ = json.Unmarshal(line, &r)
			if from[sectionOf(r.Workload)] == i {
				b.Write(line)
			}
		}
	}
	first, n := -1, 1
	var m strings.Builder
	for i, p := range parts {
		if len(used[i]) == 0 {
			continue
		}
		if first < 0 {
			first = i
			m.WriteString(strings.TrimRight(p.machine, "\n") + "\n")
			if len(used) > 1 {
				fmt.Fprintf(&m, "sections: %s\n", strings.Join(used[i], ", "))
			}
			continue
		}
		n++
		k := p.keys
		fmt.Fprintf(&m, "part %d: %s on %s with outboxd %s, Postgres %s, load %s at the start\n",
			n, strings.Join(used[i], ", "), k["date"], k["outboxd"], k["postgres"], k["load at start"])
	}
	return b.Bytes(), m.String(), nil
}
