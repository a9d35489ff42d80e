package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// ownPostgres is a Postgres of the test's own, which it may restart.
type ownPostgres struct {
	t   *testing.T
	dir string
	env []string
	dsn string
}

func startOwnPostgres(t *testing.T) *ownPostgres {
	t.Helper()
	requireServices(t)
	dir, err := os.MkdirTemp("", "outboxd-faultpg-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o755)
	t.Cleanup(func() { os.RemoveAll(dir) })
	port := freePort(t)
	pg := &ownPostgres{t: t, dir: dir,
		env: append(os.Environ(), "OUTBOXD_TESTBED_DIR="+dir, fmt.Sprintf("OUTBOXD_TESTBED_PG_PORT=%d", port)),
		dsn: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)}
	pg.script("pg-start")
	t.Cleanup(func() { pg.script("pg-stop") })
	return pg
}

func (pg *ownPostgres) script(name string, args ...string) {
	pg.t.Helper()
	cmd := exec.Command(filepath.Join("..", "scripts", "testbed", name), args...)
	cmd.Env = pg.env
	if out, err := cmd.CombinedOutput(); err != nil {
		pg.t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

// stop shuts the cluster down in mode (fast or immediate).
func (pg *ownPostgres) stop(mode string) {
	pg.t.Helper()
	pg.script("pg-stop", "--mode", mode)
}

// Scenario 3: Postgres restarted mid-stream, with a fast and an immediate
// shutdown.
func TestFaultPostgresRestart(t *testing.T) {
	pg := startOwnPostgres(t)
	d := outboxDB(t, pg.dsn)
	d.name, d.slot = "t_faultpg_"+randomSuffix(), "outboxd_fault"
	p := start(t, d.env())
	p.waitStreaming()
	spec := loadSpec{Prefix: d.name, Types: 4, IDs: 40, Writers: 2,
		Events: pick(12000, 60000), TxSizes: []int{1, 10, 100}, RollbackPct: 5, Truth: true, Tolerant: true}
	f := startFaultRun(t, d, svc.brokers, spec)
	modes := pick([]string{"fast", "immediate"}, []string{"fast", "immediate", "fast", "immediate", "immediate"})
	for _, mode := range modes {
		waitCommitted(t, f.l, f.l.committedCount()+1500)
		pg.stop(mode)
		time.Sleep(2 * time.Second)
		pg.script("pg-start")
		t.Logf("Postgres restarted after shutdown mode %s at %d committed events", mode, f.l.committedCount())
	}
	faultEnd := time.Now()
	f.finish("Postgres restart (fast, immediate)", len(modes), faultEnd, fmt.Sprintf("shutdowns %v; outboxd restarts %s", modes, restarts(p)))
	select {
	case <-p.done:
		t.Errorf("outboxd exited across Postgres restarts: %v", p.err)
	default:
	}
}
