package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocsMatchResults fails when the generated sections of BENCHMARKS.md
// and README.md are not what bench/results/latest renders to: the numbers
// in the documents are the numbers of the run whose data is kept.
func TestDocsMatchResults(t *testing.T) {
	dir := "../../results/latest"
	path, err := resultsFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := readResults([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	machine, err := os.ReadFile(filepath.Join(dir, "machine-"+sizeOf(path)+".txt"))
	if err != nil {
		t.Fatal(err)
	}
	run := newRun(rs, string(machine))
	for _, doc := range []string{"../../../BENCHMARKS.md", "../../../README.md"} {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for name, want := range run.sections(doc) {
			got, ok := section(string(data), name)
			if !ok {
				t.Errorf("%s has no generated section %q", doc, name)
				continue
			}
			if got != want {
				t.Errorf("%s: section %q differs from what %s renders to; run bench/run report", doc, name, dir)
			}
		}
	}
	report, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(report), run.body()+costBody(run.t, costCurves(run.t))) {
		t.Errorf("%s/report.md differs from what its data renders to; run bench/run report", dir)
	}
}

func TestReplaceSection(t *testing.T) {
	begin, end := markers("x")
	doc := "intro\n" + begin + "\nold\n" + end + "\nrest\n"
	got, err := replaceSection(doc, "x", "new 1\nnew 2\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "intro\n" + begin + "\nnew 1\nnew 2\n" + end + "\nrest\n"; got != want {
		t.Errorf("replaceSection = %q, want %q", got, want)
	}
	if body, ok := section(got, "x"); !ok || body != "new 1\nnew 2\n" {
		t.Errorf("section = %q, %v", body, ok)
	}
	if _, err := replaceSection("no markers", "x", "y"); err == nil {
		t.Error("replaceSection without markers: no error")
	}
}

// TestBenchmarksSize keeps BENCHMARKS.md under 25 KB (issue 36), its
// generated section included: a run of more contenders makes it longer.
func TestBenchmarksSize(t *testing.T) {
	data, err := os.ReadFile("../../../BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(data) >= 25000 {
		t.Errorf("BENCHMARKS.md is %d bytes: trim it under 25,000 (every row and spread is in bench/results/latest/report.md)", len(data))
	}
}
