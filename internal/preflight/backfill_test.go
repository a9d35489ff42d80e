package preflight

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/backfill"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/wal"
)

// TestStartRefusesASlotABackfillFills: a process without postgres.backfill
// that starts while another makes the slot with a backfill is refused,
// however the two interleave. The other process records its backfill and
// makes the slot between the first one's look at the backfill state and its
// inspection of the slot (the inspection's wrapper runs it there). The
// state used to be read before the inspection: the process found no
// backfill, then the inactive slot, and streamed it while the backfill had
// its older rows still to send (review-bf36 R2). It needs the test bed's
// Postgres (OUTBOXD_TEST_PG_DSN).
func TestStartRefusesASlotABackfillFills(t *testing.T) {
	dsn, conn := newConn(t, "bfrace")
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `CREATE TABLE public.outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
			aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now());
		INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'order', i::text, 'Placed', '{}' FROM generate_series(1, 20) AS i`); err != nil {
		t.Fatal(err)
	}
	log := testenv.Logger(t)
	for _, tc := range []struct {
		name string
		// other is what the process with the backfill does while this one
		// is between the two reads.
		other func(t *testing.T, cfg config.Config)
		want  string
	}{
		{"prepared, its rows not sent", func(t *testing.T, cfg config.Config) {
			other, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close(ctx)
			repl := func(ctx context.Context) (*pgconn.PgConn, error) { return pg.ConnectReplication(ctx, cfg.Postgres) }
			if err := backfill.Prepare(ctx, other, repl, cfg, log); err != nil {
				t.Fatal(err)
			}
		}, `is not done (phase sending, 0 of 20 rows sent)`},
		{"making the slot", func(t *testing.T, cfg config.Config) {
			// What a process waiting in CREATE_REPLICATION_SLOT has done:
			// its state saved, then the slot made.
			if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.outboxd_backfill (slot text PRIMARY KEY, state jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());
				INSERT INTO public.outboxd_backfill (slot, state) VALUES ('`+cfg.Postgres.Slot+`', jsonb_build_object('slot', '`+cfg.Postgres.Slot+`', 'phase', 'snapshot'))`); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, cfg.Postgres.Slot); err != nil {
				t.Fatal(err)
			}
		}, `has not fixed its rows yet (phase snapshot)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Postgres.DSN, cfg.Postgres.Slot = dsn, "bfrace_"+testenv.RandomSuffix()
			with := cfg
			with.Postgres.Backfill = config.Backfill{Where: "true", Batch: 100}
			inspect := func(ctx context.Context, conn *pgx.Conn, slot string) (wal.SlotInfo, bool, error) {
				tc.other(t, with)
				return wal.InspectSlot(ctx, conn, slot)
			}
			_, ok, err := inspectAtStart(ctx, conn, cfg, log, nil, inspect)
			if err == nil {
				t.Fatalf("started on the slot a backfill fills (slot found: %v); want a refusal", ok)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "outboxd_backfill_"+cfg.Postgres.Slot) {
				t.Errorf("refusal: %v; want %q, and the key table named", err, tc.want)
			}
		})
	}
}

// TestStartRefusesABackfillInAnotherSchema: the backfill keeps its state in
// its outbox table's schema. A process whose configuration lists several
// tables, or a pattern, has no one table, and used to look in public only:
// it streamed a slot a backfill in another schema was still filling
// (review-eosbf R2b). A role that may not read the state table used to be
// let through with a warning; it is refused with the GRANT to run
// (review-eosbf S1). It needs the test bed's Postgres (OUTBOXD_TEST_PG_DSN).
func TestStartRefusesABackfillInAnotherSchema(t *testing.T) {
	_, dsn := testenv.NewDatabase(t, "bfschema")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	reader := "bfreader_" + testenv.RandomSuffix()
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), `DROP OWNED BY `+reader+`; DROP ROLE IF EXISTS `+reader)
		conn.Close(context.Background())
	})
	if _, err := conn.Exec(ctx, `CREATE SCHEMA app; CREATE TABLE app.outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
			aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE app.other (LIKE app.outbox INCLUDING ALL);
		INSERT INTO app.outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'order', i::text, 'Placed', '{}' FROM generate_series(1, 20) AS i;
		CREATE ROLE `+reader+` NOLOGIN; GRANT USAGE ON SCHEMA app TO `+reader); err != nil {
		t.Fatal(err)
	}
	log := testenv.Logger(t)
	cfg := config.Default()
	cfg.Postgres.DSN, cfg.Postgres.Slot = dsn, "bfschema_"+testenv.RandomSuffix()
	with := cfg
	with.Postgres.Table, with.Postgres.Backfill = "app.outbox", config.Backfill{Where: "true", Batch: 100}
	repl := func(ctx context.Context) (*pgconn.PgConn, error) { return pg.ConnectReplication(ctx, with.Postgres) }
	if err := backfill.Prepare(ctx, conn, repl, with, log); err != nil {
		t.Fatal(err)
	}
	cfg.Postgres.Table = ""
	cfg.Postgres.Tables = []config.TableEntry{{Name: "app.outbox"}, {Name: "app.other"}}
	_, _, err = inspectAtStart(ctx, conn, cfg, log, nil, wal.InspectSlot)
	if err == nil || !strings.Contains(err.Error(), "app.outboxd_backfill is not done (phase sending, 0 of 20 rows sent)") {
		t.Errorf("a process of two tables on the slot a backfill in schema app fills: %v; want a refusal naming app.outboxd_backfill", err)
	}

	// The same, as a role that may not read the state table.
	other, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, `SET ROLE `+reader); err != nil {
		t.Fatal(err)
	}
	_, _, err = inspectAtStart(ctx, other, cfg, log, nil, wal.InspectSlot)
	if err == nil || !strings.Contains(err.Error(), `may not read the backfill state table app.outboxd_backfill`) ||
		!strings.Contains(err.Error(), `GRANT SELECT ON "app"."outboxd_backfill" TO <role>`) {
		t.Errorf("a role that may not read the state table: %v; want a refusal with the GRANT to run", err)
	}
	if _, err := conn.Exec(ctx, `GRANT SELECT ON app.outboxd_backfill TO `+reader); err != nil {
		t.Fatal(err)
	}
	if _, _, err = inspectAtStart(ctx, other, cfg, log, nil, wal.InspectSlot); err == nil || !strings.Contains(err.Error(), "is not done") {
		t.Errorf("the role granted SELECT: %v; want the refusal of the unfinished backfill", err)
	}

	// Another deployment's state table that the role may not read, with a
	// finished backfill of its own slot, does not stop a slot whose key
	// table is not there; it does once that key table is (review-fix55
	// Should 3). Another session's temporary table of the name is no state
	// table; a table of the name without outboxd's columns is refused with
	// a rename (Should 4).
	mine := cfg
	mine.Postgres.Slot = "bfmine_" + testenv.RandomSuffix()
	if _, err := conn.Exec(ctx, `CREATE SCHEMA theirs; CREATE TABLE theirs.outboxd_backfill (slot text PRIMARY KEY, state jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());
		INSERT INTO theirs.outboxd_backfill (slot, state) VALUES ('theirs', '{"slot": "theirs", "phase": "done"}')`); err != nil {
		t.Fatal(err)
	}
	scratch, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer scratch.Close(ctx)
	if _, err := scratch.Exec(ctx, `CREATE TEMP TABLE outboxd_backfill (slot text, state jsonb)`); err != nil {
		t.Fatal(err)
	}
	if _, _, err = inspectAtStart(ctx, other, mine, log, nil, wal.InspectSlot); err != nil {
		t.Errorf("another deployment's unreadable state table, without this slot's key table, and another session's temporary table: %v; want the start to go on", err)
	}
	if _, _, err = inspectAtStart(ctx, conn, mine, log, nil, wal.InspectSlot); err != nil {
		t.Errorf("a superuser beside another session's temporary table of the name: %v; want the start to go on", err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE theirs.outboxd_backfill_`+mine.Postgres.Slot+` ()`); err != nil {
		t.Fatal(err)
	}
	_, _, err = inspectAtStart(ctx, other, mine, log, nil, wal.InspectSlot)
	if err == nil || !strings.Contains(err.Error(), `may not read the backfill state table theirs.outboxd_backfill`) ||
		!strings.Contains(err.Error(), `the slot's key table "theirs"."outboxd_backfill_`+mine.Postgres.Slot+`" is there`) {
		t.Errorf("this slot's key table beside an unreadable state table: %v; want the refusal with the GRANT", err)
	}
	if _, err := conn.Exec(ctx, `DROP TABLE theirs.outboxd_backfill_`+mine.Postgres.Slot+`; CREATE SCHEMA misc; CREATE TABLE misc.outboxd_backfill (id int)`); err != nil {
		t.Fatal(err)
	}
	_, _, err = inspectAtStart(ctx, other, mine, log, nil, wal.InspectSlot)
	if err == nil || !strings.Contains(err.Error(), "table misc.outboxd_backfill is not a backfill state table of outboxd") ||
		!strings.Contains(err.Error(), `Rename it (ALTER TABLE "misc"."outboxd_backfill" RENAME TO …)`) {
		t.Errorf("a table of the name that is not outboxd's: %v; want a refusal saying to rename it", err)
	}
}
