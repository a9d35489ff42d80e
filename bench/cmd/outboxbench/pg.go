package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("connecting to Postgres: %w", err)
	}
	return conn, nil
}

func cmdSetup(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("setup", flag.ExitOnError)
	c.register(fs)
	_ = fs.Parse(args)
	conn, err := connect(ctx, c.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		// migrations/0001_outbox.sql
		`CREATE TABLE IF NOT EXISTS public.outbox (
		    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
		    aggregate_type text        NOT NULL,
		    aggregate_id   text        NOT NULL,
		    event_type     text        NOT NULL,
		    payload        jsonb,
		    created_at     timestamptz NOT NULL DEFAULT now())`,
		`CREATE TABLE IF NOT EXISTS public.bench_other (id bigserial PRIMARY KEY, v text, at timestamptz DEFAULT now())`,
		`TRUNCATE public.outbox, public.bench_other`,
		`DO $$ BEGIN
		   IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'bench') THEN
		     CREATE PUBLICATION bench FOR TABLE public.outbox;
		   END IF; END $$`,
		// Stale slots from an earlier, interrupted harness run.
		`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
		  WHERE slot_name LIKE 'bench%' AND NOT active`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("setup: %s: %w", strings.Fields(q)[0], err)
		}
	}
	return nil
}

func cmdSlot(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("slot", flag.ExitOnError)
	c.register(fs)
	drop := fs.Bool("drop", false, "only drop the slot")
	_ = fs.Parse(args)
	conn, err := connect(ctx, c.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, c.slot); err != nil {
		return fmt.Errorf("dropping slot %s: %w", c.slot, err)
	}
	if *drop {
		return nil
	}
	var lsn string
	if err := conn.QueryRow(ctx, `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`, c.slot).Scan(&lsn); err != nil {
		return fmt.Errorf("creating slot %s: %w", c.slot, err)
	}
	fmt.Println(lsn)
	return nil
}

// fillSQL writes n events in transactions of tx rows inside one DO block
// (procedures may COMMIT since PG 11). Payloads are jsonb
// {"seq": g, "data": "<hex>"} of about size bytes in text form; the hex comes
// from md5 of distinct inputs, so TOAST compression cannot shrink large ones
// to nothing.
//
// With other, each transaction also writes as many rows to
// public.bench_other, a table no outbox publication lists, each about as
// large in the WAL: the busy non-outbox table of the multitable section,
// written in the events' own transactions as an application writes its
// business rows beside its outbox rows.
func fillSQL(prefix string, types, n, tx, size int, deleteRows, other bool) string {
	data := max(size-30, 1)
	md5s := data/32 + 1
	commit := "COMMIT;"
	if tx >= n {
		commit = ""
	}
	if deleteRows { // insert-then-delete: each transaction leaves the table as it found it
		commit = "DELETE FROM public.outbox; " + commit
	}
	if other { // v stands for the payload and what the outbox row's other columns take
		v := size + 60
		commit = fmt.Sprintf(`INSERT INTO public.bench_other (v)
    SELECT substr((SELECT string_agg(md5('o' || g::text || '.' || k::text), '') FROM generate_series(1, %d) k), 1, %d)
      FROM generate_series(i, least(i + %d, %d) - 1) g;
    `, v/32+1, v, tx, n) + commit
	}
	return fmt.Sprintf(`DO $$
DECLARE i int := 0;
BEGIN
  WHILE i < %[1]d LOOP
    INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
    SELECT '%[2]s_t' || (g %% %[3]d), 'agg-' || ((g::bigint * 7919) %% 10000), 'Created',
           jsonb_build_object('seq', g, 'data',
             substr((SELECT string_agg(md5(g::text || '.' || k::text), '') FROM generate_series(1, %[4]d) k), 1, %[5]d))
      FROM generate_series(i, least(i + %[6]d, %[1]d) - 1) g;
    %[7]s
    i := i + %[6]d;
  END LOOP;
END $$`, n, prefix, types, md5s, data, tx, commit)
}

// outboxTables names the K outbox tables of a several-tables workload:
// public.<prefix>_m0 … _m<K-1>, with outbox's shape.
func outboxTables(prefix string, k int) []string {
	names := make([]string, k)
	for j := range names {
		names[j] = fmt.Sprintf("public.%s_m%d", prefix, j)
	}
	return names
}

// tablesPublication is the publication of a several-tables workload's tables.
func tablesPublication(prefix string) string { return prefix + "_pub" }

// fillTablesSQL is fillSQL over k outbox tables: row g goes to table g mod
// k, so every transaction of tx rows writes min(tx, k) tables.
func fillTablesSQL(prefix string, k, types, n, tx, size int) string {
	data := max(size-30, 1)
	md5s := data/32 + 1
	commit := "COMMIT;"
	if tx >= n {
		commit = ""
	}
	return fmt.Sprintf(`DO $$
DECLARE i int := 0;
BEGIN
  WHILE i < %[1]d LOOP
    FOR j IN 0 .. %[8]d - 1 LOOP
      EXECUTE format($q$INSERT INTO public.%[2]s_m%%s (aggregate_type, aggregate_id, event_type, payload)
        SELECT '%[2]s_t' || (g %%%% %[3]d), 'agg-' || ((g::bigint * 7919) %%%% 10000), 'Created',
               jsonb_build_object('seq', g, 'data',
                 substr((SELECT string_agg(md5(g::text || '.' || k::text), '') FROM generate_series(1, %[4]d) k), 1, %[5]d))
          FROM generate_series($1, $2) g WHERE g %%%% %[8]d = $3$q$, j)
        USING i, least(i + %[6]d, %[1]d) - 1, j;
    END LOOP;
    %[7]s
    i := i + %[6]d;
  END LOOP;
END $$`, n, prefix, types, md5s, data, tx, commit, k)
}

// tablesSQL creates (or, with drop, drops) a several-tables workload's k
// outbox tables and their publication.
func tablesSQL(prefix string, k int, drop bool) []string {
	names := outboxTables(prefix, k)
	qs := []string{"DROP PUBLICATION IF EXISTS " + tablesPublication(prefix)}
	for _, t := range names {
		qs = append(qs, "DROP TABLE IF EXISTS "+t)
	}
	if drop {
		return qs
	}
	for _, t := range names {
		qs = append(qs, "CREATE TABLE "+t+" (LIKE public.outbox INCLUDING ALL)")
	}
	return append(qs, "CREATE PUBLICATION "+tablesPublication(prefix)+" FOR TABLE "+strings.Join(names, ", ")+
		" WITH (publish = 'insert, update', publish_via_partition_root = true)")
}

func cmdFill(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("fill", flag.ExitOnError)
	c.register(fs)
	n := fs.Int("n", 50000, "events")
	tx := fs.Int("tx", 100, "rows per transaction (>= n: one transaction)")
	size := fs.Int("size", 250, "approximate payload bytes")
	deleteRows := fs.Bool("delete", false, "delete each transaction's rows before it commits (insert-then-delete)")
	tables := fs.Int("tables", 0, "> 0: write the rows over this many outbox tables of their own (made by the tables subcommand), not public.outbox")
	other := fs.Bool("other", false, "in each transaction, also write as many rows of about the same size to public.bench_other (a table no outbox publication lists)")
	keep := fs.Bool("keep", false, "leave the rows in the table (the backfill and replay sections read them); default: truncate after the fill")
	_ = fs.Parse(args)
	conn, err := connect(ctx, c.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	q, truncate := fillSQL(c.prefix, c.types, *n, *tx, *size, *deleteRows, *other), "public.outbox"
	if *other {
		truncate += ", public.bench_other"
	}
	if *tables > 0 {
		if *deleteRows || *other {
			return fmt.Errorf("fill: -tables goes with neither -delete nor -other")
		}
		q, truncate = fillTablesSQL(c.prefix, *tables, c.types, *n, *tx, *size), strings.Join(outboxTables(c.prefix, *tables), ", ")
	}
	if _, err := conn.Exec(ctx, q); err != nil {
		return fmt.Errorf("filling outbox: %w", err)
	}
	// Keep the table small between workloads: the WAL keeps the inserts.
	if !*keep {
		if _, err := conn.Exec(ctx, `TRUNCATE `+truncate); err != nil {
			return fmt.Errorf("truncating outbox: %w", err)
		}
	}
	var lsn string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		return err
	}
	fmt.Println(lsn)
	return nil
}

// slotLag returns the bytes of WAL the slot retains beyond its confirmed
// position, or -1 if the slot is missing. For outboxd with postgres.shards,
// slot is the shards' base name and the worst of slot_<i>of<n> counts.
func slotLag(ctx context.Context, conn *pgx.Conn, slot string) (int64, error) {
	var lag *int64
	err := conn.QueryRow(ctx, `SELECT max(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn))::bigint
	  FROM pg_replication_slots WHERE slot_name = $1 OR slot_name ~ ('^' || $1 || '_[0-9]+of[0-9]+$')`, slot).Scan(&lag)
	if err == pgx.ErrNoRows || (err == nil && lag == nil) {
		return -1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading slot lag: %w", err)
	}
	return *lag, nil
}

func slotActive(ctx context.Context, conn *pgx.Conn, slot string) bool {
	var active bool
	_ = conn.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
	return active
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// payload returns the jsonb text form Postgres gives for
// jsonb_build_object('seq', seq, 'data', <about size-30 hex chars>).
func payload(seq, size int) string {
	data := max(size-30, 1)
	var sb strings.Builder
	var b [16]byte
	for sb.Len() < data {
		_, _ = rand.Read(b[:])
		sb.WriteString(hex.EncodeToString(b[:]))
	}
	return fmt.Sprintf(`{"seq": %d, "data": "%s"}`, seq, sb.String()[:data])
}

// cmdTables creates, or with -drop drops, the outbox tables and the
// publication of a several-tables workload.
func cmdTables(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("tables", flag.ExitOnError)
	c.register(fs)
	k := fs.Int("n", 1, "outbox tables")
	drop := fs.Bool("drop", false, "only drop them")
	_ = fs.Parse(args)
	conn, err := connect(ctx, c.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, q := range tablesSQL(c.prefix, *k, *drop) {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("tables: %s: %w", q, err)
		}
	}
	return nil
}
