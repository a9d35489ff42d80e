package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/wal"
)

// Connect opens a regular (non-replication) connection.
func Connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres.dsn is not a valid connection string: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to Postgres at %s:%d as %s: %w; check postgres.dsn and that the server is running",
			cfg.Host, cfg.Port, cfg.User, unwrapConnect(err))
	}
	return conn, nil
}

// connectReplication opens a logical replication connection.
func connectReplication(ctx context.Context, dsn string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres.dsn is not a valid connection string: %w", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "outboxd"
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening replication connection to %s:%d as %s: %w", cfg.Host, cfg.Port, cfg.User, unwrapConnect(err))
	}
	return conn, nil
}

// unwrapConnect keeps the server's or the network's reason and drops pgconn's
// preamble, which repeats the host and user.
func unwrapConnect(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Unwrap() != nil {
		return ce.Unwrap()
	}
	return err
}

// Check runs the start-up checks and prepares the publication and slot. Each
// failure is one line that says what is wrong and what to do.
func (r *Relay) Check(ctx context.Context) error {
	conn, err := Connect(ctx, r.cfg.Postgres.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := checkServer(ctx, conn, r.cfg.Postgres, r.router.Columns()); err != nil {
		return err
	}
	if err := r.ensureSlot(ctx, conn); err != nil {
		return err
	}
	p, err := r.newProducer()
	if err != nil {
		return err
	}
	defer p.Close()
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return p.Ping(pctx)
}

func checkServer(ctx context.Context, conn *pgx.Conn, cfg config.Postgres, columns []string) error {
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return fmt.Errorf("reading wal_level: %w", err)
	}
	if walLevel != "logical" {
		return fmt.Errorf("wal_level is %s; set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart Postgres", walLevel)
	}
	var user string
	var canReplicate bool
	err := conn.QueryRow(ctx, `SELECT current_user, rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&user, &canReplicate)
	if err != nil {
		return fmt.Errorf("reading the role's attributes: %w", err)
	}
	if !canReplicate {
		return fmt.Errorf("role %s lacks the REPLICATION attribute; run ALTER ROLE %s WITH REPLICATION, or connect as a role that has it", user, pgx.Identifier{user}.Sanitize())
	}
	schema, table := cfg.TableName()
	var present []string
	err = conn.QueryRow(ctx, `SELECT coalesce(array_agg(a.attname::text), '{}') FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')
		HAVING count(c.oid) > 0`, schema, table).Scan(&present)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("outbox table %s does not exist; run 'outboxd migrate' to create it, or set postgres.table to your outbox table", cfg.Table)
	}
	if err != nil {
		return fmt.Errorf("reading outbox table %s: %w", cfg.Table, err)
	}
	var missing []string
	for _, c := range columns {
		if !contains(present, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("outbox table %s has no column %s; add it or set the router.*_column settings to the table's column names",
			cfg.Table, strings.Join(missing, ", "))
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// ensureSlot creates the publication and slot when missing and allowed, and
// refuses an unusable slot.
func (r *Relay) ensureSlot(ctx context.Context, conn *pgx.Conn) error {
	pg := r.cfg.Postgres
	schema, table := pg.TableName()
	created, err := wal.EnsurePublication(ctx, conn, pg.Publication, schema, table, pg.CreatePublication)
	if err != nil {
		return err
	}
	if created {
		r.log.Info("created publication", "publication", pg.Publication, "table", pg.Table)
	}
	info, ok, err := wal.InspectSlot(ctx, conn, pg.Slot)
	if err != nil {
		return err
	}
	if !ok {
		if !pg.CreateSlot {
			return wal.Errorf(wal.ErrSlotMissing, "replication slot %q does not exist; set postgres.create_slot: true, or create it with SELECT pg_create_logical_replication_slot('%s', 'pgoutput')",
				pg.Slot, pg.Slot)
		}
		lsn, err := wal.CreateSlot(ctx, conn, pg.Slot)
		if err != nil {
			return err
		}
		r.log.Info("created replication slot; events committed from here on will be delivered", "slot", pg.Slot, "lsn", lsn)
		return nil
	}
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		return fmt.Errorf("reading current database: %w", err)
	}
	err = wal.CheckSlot(info, db)
	var active *wal.SlotActiveError
	if errors.As(err, &active) {
		r.log.Warn(err.Error(), "slot", pg.Slot)
		return nil
	}
	return err
}
