package testenv

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Dependencies point one way (DESIGN.md, "Package map"): the client
// libraries and their tests compile none of the engine, the leaves that
// several commands share and the test helpers do not import the relay, and
// only cmd/outboxd imports the relay: no other package of the module, and
// none of the integration suite's module (test/), which runs outboxd as
// production does (package daemon) or uses the packages relay is built
// from. A test helper that imports the engine, or a shared type left in
// relay, shows here first.
func TestLayering(t *testing.T) {
	const mod = "github.com/outboxd/outboxd/"
	goList := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				err = errors.Join(err, errors.New(string(ee.Stderr)))
			}
			t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	for _, tc := range []struct {
		args      []string
		forbidden []string
	}{
		{[]string{"-deps", "-test", mod + "outbox", mod + "consumer"}, []string{"relay", "sink", "wal"}},
		{[]string{"-deps", mod + "internal/admin", mod + "internal/httpserver", mod + "internal/status", mod + "internal/testenv"}, []string{"relay"}},
	} {
		deps := strings.Fields(goList(tc.args...))
		for _, f := range tc.forbidden {
			if slices.Contains(deps, mod+f) {
				t.Errorf("go list %s includes %s", strings.Join(tc.args, " "), f)
			}
		}
	}
	// One package a line: its path, then what it and its tests import.
	var importers []string
	for _, line := range strings.Split(strings.TrimSpace(goList("-f", `{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, mod+"...")), "\n") {
		f := strings.Fields(line)
		if f[0] != mod+"relay" && slices.Contains(f[1:], mod+"relay") {
			importers = append(importers, strings.TrimPrefix(f[0], mod))
		}
	}
	if !slices.Equal(importers, []string{"cmd/outboxd"}) {
		t.Errorf("packages importing relay (with their tests): %v, want only cmd/outboxd", importers)
	}
	// The integration suite's module (-e: what its imports are needs none
	// of its requirements downloaded).
	suite := goList("-C", "../../test", "-e", "-f", `{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, "./...")
	for _, line := range strings.Split(strings.TrimSpace(suite), "\n") {
		if f := strings.Fields(line); slices.Contains(f[1:], mod+"relay") {
			t.Errorf("%s (module test/, with its tests) imports relay; want only cmd/outboxd to", f[0])
		}
	}
}
