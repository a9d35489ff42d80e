package test

import (
	"testing"
	"time"
)

// An UNLOGGED partition, at any depth, of an outbox table named exactly
// (no pattern, so no event trigger) is refused at start-up, naming it,
// with SET LOGGED and replay for remedy; one made while outboxd runs stops
// it at the next periodic check (postgres.slot_lag_interval). Postgres
// writes no WAL for its rows: they used to be lost without a word
// (review-fix55 Must 1).
func TestStartRefusesUnloggedPartition(t *testing.T) {
	d := newDB(t)
	d.exec(t, `CREATE TABLE public.pout (LIKE public.outbox INCLUDING DEFAULTS) PARTITION BY RANGE (created_at);
		CREATE TABLE public.pout_a PARTITION OF public.pout FOR VALUES FROM ('2000-01-01') TO ('2100-01-01') PARTITION BY LIST (aggregate_type);
		CREATE UNLOGGED TABLE public.pout_u PARTITION OF public.pout_a DEFAULT`)
	env := d.env("OUTBOXD_POSTGRES_TABLE=public.pout")
	expectStartupError(t, env, `outbox table public\.pout has the UNLOGGED partition public\.pout_u: Postgres writes no WAL for its rows.*`+
		`ALTER TABLE public\.pout_u SET LOGGED.*outboxd replay -table public\.pout -where`)
	if slot := d.confirmedFlush(t); slot != 0 {
		t.Fatalf("the start-up check let outboxd make the slot (confirmed to %X) before it refused the unlogged partition", slot)
	}
	d.exec(t, `ALTER TABLE public.pout_u SET LOGGED`)
	p := start(t, env)
	p.waitStreaming()
	d.exec(t, `ALTER TABLE public.pout_u SET UNLOGGED`)
	if code := p.waitExit(30 * time.Second); code == 0 {
		t.Fatalf("outboxd exited 0 after a partition of its outbox table was made UNLOGGED")
	}
	p.waitLog(`outbox table public\.pout has the UNLOGGED partition public\.pout_u`, time.Second)
}

// An UNLOGGED outbox table named exactly, in a configuration without a
// pattern, is refused by outboxd at start-up with SET LOGGED for remedy,
// before the slot is made; it used to meet Postgres's own refusal of the
// publication, without outboxd's remedy (review-fix55 N1).
func TestStartRefusesUnloggedTable(t *testing.T) {
	d := newDB(t)
	d.exec(t, `CREATE UNLOGGED TABLE public.uout (LIKE public.outbox INCLUDING ALL)`)
	env := d.env("OUTBOXD_POSTGRES_TABLE=public.uout")
	expectStartupError(t, env, `outbox table public\.uout is UNLOGGED: Postgres writes no WAL for its rows.*`+
		`make it logged: ALTER TABLE public\.uout SET LOGGED; send the rows it holds now.*outboxd replay -table public\.uout -where`)
	if slot := d.confirmedFlush(t); slot != 0 {
		t.Fatalf("the start-up check let outboxd make the slot (confirmed to %X) before it refused the unlogged table", slot)
	}
	d.exec(t, `ALTER TABLE public.uout SET LOGGED`)
	p := start(t, env)
	p.waitStreaming()
}
