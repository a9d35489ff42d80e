package test

import "testing"

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
