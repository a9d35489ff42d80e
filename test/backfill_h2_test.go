package test

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"testing"
	"time"
)

// A backfill whose CREATE_REPLICATION_SLOT fails leaves no state behind,
// and a start finds a slot of its name to drop only if the state recorded
// making it and nothing was confirmed from it since (review H2). Before,
// the failed creation left a state of phase snapshot, and a later start
// dropped whatever inactive slot had that name, one another process had
// made and streamed from.
func TestBackfillLeavesNoClaimOnASlotItDidNotMake(t *testing.T) {
	s := newBackfillSetup(t, 200, 5)
	ctx := context.Background()
	cfg := writeConfig(t, backfillConfig(100, 0))
	stateRows := func() int {
		t.Helper()
		var n int
		if err := s.d.pool.QueryRow(ctx, `SELECT count(*) FROM public.outboxd_backfill WHERE slot = $1`, s.d.slot).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	slotAt := func() string {
		t.Helper()
		var lsn string
		if err := s.d.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, s.d.slot).Scan(&lsn); err != nil {
			t.Fatalf("the slot %s: %v", s.d.slot, err)
		}
		return lsn
	}

	// 1. Every replication slot in use: CREATE_REPLICATION_SLOT fails.
	var free int
	if err := s.d.pool.QueryRow(ctx, `SELECT current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)`).Scan(&free); err != nil {
		t.Fatal(err)
	}
	fill := fmt.Sprintf("h2fill_%s_", s.d.name)
	s.d.exec(t, `SELECT pg_create_physical_replication_slot($1 || i) FROM generate_series(1, $2) AS i`, fill, free)
	drop := func() {
		_, _ = s.d.pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE $1 || '%'`, fill)
	}
	t.Cleanup(drop)
	p := start(t, s.d.env(), "-config", cfg)
	t.Log(p.waitLog(`replication slots are in use[^\n]*`, 30*time.Second))
	p.kill()
	drop()
	if n := stateRows(); n != 0 {
		t.Errorf("the failed slot creation left %d backfill state rows for slot %s; want none", n, s.d.slot)
	}

	// 2. Another process makes a slot of that name and streams from it.
	var made string
	if err := s.d.pool.QueryRow(ctx, `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`, s.d.slot).Scan(&made); err != nil {
		t.Fatal(err)
	}
	s.d.exec(t, `CREATE TABLE other_writes (n int); INSERT INTO other_writes SELECT generate_series(1, 100)`)
	s.d.exec(t, `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, s.d.slot)
	streamed := slotAt()
	p = start(t, s.d.env(), "-config", cfg)
	if code := p.waitExit(30 * time.Second); code == 0 {
		t.Fatal("outboxd exited 0 with a backfill on a slot it did not make")
	}
	p.waitLog(`exists and was not made by a backfill`, time.Second)
	if got := slotAt(); got != streamed {
		t.Errorf("the other process's slot is at %s, was at %s: outboxd dropped and made it again", got, streamed)
	}

	// 3. A state of phase snapshot that recorded making a slot at a point
	// the slot has been confirmed past: not the backfill's slot, kept.
	s.d.exec(t, `INSERT INTO public.outboxd_backfill (slot, state) VALUES ($1, jsonb_build_object('slot', $1::text, 'phase', 'snapshot', 'lsn', $2::text))`, s.d.slot, made)
	p = start(t, s.d.env(), "-config", cfg)
	if code := p.waitExit(30 * time.Second); code == 0 {
		t.Fatal("outboxd exited 0 with a backfill on a slot confirmed past the point its state recorded")
	}
	// Something confirmed from it: the remedy must not be to drop it
	// (review-bf36 R1), which would lose what that consumer has not seen.
	refusal := p.waitLog(`another process streamed from it[^\n]*`, time.Second)
	if strings.Contains(refusal, "pg_drop_replication_slot") || !strings.Contains(refusal, "outboxd replay") {
		t.Errorf("the refusal advises a drop or no replay: %s", refusal)
	}
	if got := slotAt(); got != streamed {
		t.Errorf("the slot is at %s, was at %s: outboxd dropped a slot its backfill did not make", got, streamed)
	}
}

// A save of phase sending that fails after the key table's transaction
// committed keeps the slot: the server may have applied the save and lost
// only its reply, and the next start then resumes phase sending on that
// slot. The deferred cleanup used to drop the slot on any error, and a
// start after an applied save was refused (the slot the state records no
// longer exists) until the operator cleared the state by hand, the
// backfill starting over (review-bf36 R3).
func TestBackfillKeepsItsSlotOnceTheRowsAreFixed(t *testing.T) {
	s := newBackfillSetup(t, 300, 10)
	ctx := context.Background()
	cfg := writeConfig(t, backfillConfig(100, 0))
	keys := "public." + s.keyTable()
	// The state table as outboxd makes it, with a trigger that fails the
	// save of phase sending.
	s.d.exec(t, `CREATE TABLE public.outboxd_backfill (slot text PRIMARY KEY, state jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());
		CREATE FUNCTION fail_sending() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.state->>'phase' = 'sending' THEN RAISE EXCEPTION 'the test fails the save of phase sending'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER fail_sending BEFORE INSERT OR UPDATE ON public.outboxd_backfill FOR EACH ROW EXECUTE FUNCTION fail_sending()`)
	p := start(t, s.d.env(), "-config", cfg)
	if code := p.waitExit(30 * time.Second); code == 0 {
		t.Fatal("outboxd exited 0 with the save of phase sending failing")
	}
	p.waitLog(`the test fails the save of phase sending`, time.Second)
	var phase, recorded, at string
	if err := s.d.pool.QueryRow(ctx, `SELECT coalesce((SELECT state->>'phase' FROM public.outboxd_backfill WHERE slot = $1), 'none'),
		coalesce((SELECT state->>'lsn' FROM public.outboxd_backfill WHERE slot = $1), 'none'),
		coalesce((SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1), 'dropped')`, s.d.slot).Scan(&phase, &recorded, &at); err != nil {
		t.Fatal(err)
	}
	if at != recorded || phase != "snapshot" {
		t.Fatalf("after the failed save: state phase %s recorded at %s, the slot %s; want phase snapshot and the slot kept at the recorded point", phase, recorded, at)
	}
	// What a save the server applied, its reply lost, leaves: phase
	// sending on the kept slot. The next start resumes it.
	s.d.exec(t, `DROP TRIGGER fail_sending ON public.outboxd_backfill;
		UPDATE public.outboxd_backfill SET state = state || jsonb_build_object('phase', 'sending', 'total', (SELECT count(*) FROM `+keys+`))`)
	p = start(t, s.d.env(), "-config", cfg)
	p.waitStreaming()
	t.Log(p.waitLog(`msg="backfill done[^"]*"[^\n]*`, time.Second))
	done := make(chan error, 1)
	done <- nil
	if r := verifyLoad(t, s.l, done); r.Duplicates != 0 {
		t.Errorf("%d duplicates; want none", r.Duplicates)
	}
}

// keyTable is the name of the setup's key table, as outboxd names it
// (internal/backfill keyTable): outboxd_backfill_<slot>, cut to 63 bytes
// with a hash of the slot's name.
func (s *backfillSetup) keyTable() string {
	name := "outboxd_backfill_" + s.d.slot
	if len(name) <= 63 {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(s.d.slot))
	return fmt.Sprintf("%s_%08x", name[:63-9], h.Sum32())
}
