package test

import (
	"encoding/json"
	"regexp"
	"testing"
)

// Issue 35 §1, review finding F5: postgres.tables listing a partitioned
// table and one of its partitions is refused at start-up with both names.
// Otherwise the partition's rows are published under the parent's name,
// its entry never applies, and every start asks to add it to the
// publication.
func TestSeveralTablesRefusePartitionOfListed(t *testing.T) {
	d := newDB(t)
	d.exec(t, `CREATE TABLE public.events (LIKE public.outbox INCLUDING DEFAULTS) PARTITION BY LIST (aggregate_type);
		CREATE TABLE public.events_2026 PARTITION OF public.events DEFAULT`)
	yaml := "postgres:\n  tables:\n    - public.outbox\n    - public.events\n    - public.events_2026\nrouter:\n  messages:\n    unowned: ignore\n"
	expectStartupError(t, d.env(), `postgres.tables\[2\] public.events_2026 is a partition of postgres.tables\[1\] public.events; list one of them`,
		"-config", writeConfig(t, yaml))
}

// outboxd status lists each outbox table with its size estimate, and the
// JSON report has each under tables (issue 35 §1, "Everything per table").
func TestSeveralTablesStatus(t *testing.T) {
	d := newDB(t)
	s := severalShapes[1]
	d.exec(t, s.create)
	d.exec(t, s.insert, uuid(), "st", "7", "Happened", `{}`)
	d.exec(t, `ANALYZE orders.events`)
	cfg := writeConfig(t, "postgres:\n  tables:\n    - public.outbox\n    - name: "+s.table+"\n      router: "+s.router+"\nrouter:\n  messages:\n    unowned: ignore\n")
	p := start(t, d.env(), "-config", cfg)
	p.waitStreaming()
	env := replace(d.env(), "OUTBOXD_HTTP_LISTEN", p.addr)
	run := func(args ...string) string { return runStatus(t, env, append([]string{"-config", cfg}, args...)...) }
	text := run()
	t.Logf("outboxd status:\n%s", text)
	for _, want := range []string{`(?m)^outbox +public\.outbox: (~0 rows|rows not known \(never analysed\)), `, `(?m)^outbox +orders\.events: ~1 rows, `} {
		if !regexp.MustCompile(want).MatchString(text) {
			t.Errorf("status output lacks %q", want)
		}
	}
	var rep struct {
		Tables []struct {
			Name   string `json:"name"`
			Exists bool   `json:"exists"`
			Rows   int64  `json:"rows_estimate"`
			Bytes  int64  `json:"bytes"`
		} `json:"tables"`
	}
	if err := json.Unmarshal([]byte(run("-json")), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Tables) != 2 || rep.Tables[0].Name != "public.outbox" || rep.Tables[1].Name != "orders.events" ||
		!rep.Tables[1].Exists || rep.Tables[1].Rows != 1 || rep.Tables[1].Bytes <= 0 {
		t.Errorf("tables in the JSON report: %+v", rep.Tables)
	}
}
