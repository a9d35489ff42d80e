package preflight

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/backfill"
	"github.com/outboxd/outboxd/internal/pg"
	"github.com/outboxd/outboxd/internal/quote"
	"github.com/outboxd/outboxd/internal/reshard"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// Checker runs the start-up checks of one slot (one shard of the
// configured layout) and the inspection of the slot before each pipeline.
// It holds only what the configuration says; what the checks learn of the
// slot's history travels in a *History the caller owns.
type Checker struct {
	cfg         config.Config
	per         []config.Config // each outbox table's configuration (config.Config.PerTable)
	perErr      error
	shard       shard.Shard
	log         *slog.Logger
	newProducer func() (*sink.Producer, error)
	progress    func() Progress
}

// Progress is what this process last confirmed, as its status reports it,
// for the message of a slot lost in a promotion.
type Progress struct {
	SentLSN      string    // the last position sent to Postgres as confirmed, "" when none
	CommitTime   time.Time // the commit time of the last confirmed transaction, zero when none
	ConfirmedLSN string    // the slot's confirmed position as Postgres applied it, "" when unknown
}

// New returns the Checker of shard sh (Index 0 of Count 1 when unsharded)
// of a validated cfg, whose postgres.slot and postgres.publication are the
// shard's. newProducer opens the Kafka client the checks warm; progress
// reports what this process confirmed.
func New(cfg config.Config, sh shard.Shard, log *slog.Logger, newProducer func() (*sink.Producer, error), progress func() Progress) *Checker {
	per, err := cfg.PerTable()
	return &Checker{cfg: cfg, per: per, perErr: err, shard: sh, log: log, newProducer: newProducer, progress: progress}
}

// ConnectReplication opens a logical replication connection to any host
// of postgres.dsn.
func (c *Checker) ConnectReplication(ctx context.Context) (*pgconn.PgConn, error) {
	c.log.Debug("opening a replication connection", "slot", c.cfg.Postgres.Slot)
	return pg.ConnectReplication(ctx, c.cfg.Postgres)
}

// ReplicationBeside opens the replication connection to the server conn
// is connected to, whichever host of postgres.dsn that is.
func (c *Checker) ReplicationBeside(ctx context.Context, conn *pgx.Conn) (*pgconn.PgConn, error) {
	return c.ReplicationAt(ctx, pg.Addr(conn.PgConn().Conn()))
}

// ReplicationAt opens a replication connection to the server at addr
// (pg.Addr), or to any host of postgres.dsn when addr is "".
func (c *Checker) ReplicationAt(ctx context.Context, addr string) (*pgconn.PgConn, error) {
	c.log.Debug("opening a replication connection", "slot", c.cfg.Postgres.Slot, "at", addr)
	return pg.ConnectReplicationAt(ctx, c.cfg.Postgres, addr)
}

// BesideOrClose returns repl, a replication connection opened side by side
// with conn, when both reached the same server; else it closes repl and
// returns nil, and the caller opens one beside conn (ReplicationBeside).
func BesideOrClose(conn *pgx.Conn, repl *pgconn.PgConn) *pgconn.PgConn {
	if repl == nil || conn == nil || pg.Addr(repl.Conn()) == pg.Addr(conn.PgConn().Conn()) {
		return repl
	}
	repl.Close(context.Background())
	return nil
}

// Checked is what Check found and opened: the table schema each table's
// router is built from, the slot's history, and the connections and Kafka client for
// the first pipeline, so that its first event does not wait for them to be
// opened again. Each of Conn, Repl and Producer is nil when Check could not
// open it (the first pipeline opens its own); whoever takes one closes it.
type Checked struct {
	Schemas []router.Schema // of each outbox table, in the order of Per
	// Per is each outbox table's configuration: config.Config.PerTable,
	// or with patterns PerTableOf the tables they matched.
	Per      []config.Config
	History  History
	Conn     *pgx.Conn      // Check's connection, for the first slot inspection
	Repl     *pgconn.PgConn // the replication connection, beside Conn
	Producer *sink.Producer // the Kafka client, warmed by sink.Producer.Warm
}

// Close closes the connections and the client no one took. It is safe on
// a nil *Checked and more than once.
func (o *Checked) Close() {
	if o == nil {
		return
	}
	if o.Conn != nil {
		o.Conn.Close(context.Background())
	}
	if o.Repl != nil {
		o.Repl.Close(context.Background())
	}
	if o.Producer != nil {
		o.Producer.Close()
	}
	o.Conn, o.Repl, o.Producer = nil, nil, nil
}

// TakeProducer returns the warmed client, nil when there is none (or o is
// nil), and leaves nil in its place.
func (o *Checked) TakeProducer() *sink.Producer {
	if o == nil {
		return nil
	}
	p := o.Producer
	o.Producer = nil
	return p
}

// Check runs the start-up checks and prepares the publication and slot,
// from the slot's history h (the zero History in a fresh process). Each
// failure is one line that says what is wrong and what to do. The Postgres
// and the Kafka checks run side by side, and the replication connection is
// opened beside them. On error it has closed everything it opened, and
// only the History of what it returns is set.
func (c *Checker) Check(ctx context.Context, h History) (Checked, error) {
	besideChecks, cancel := context.WithCancel(ctx)
	defer cancel()
	type warmed struct {
		p   *sink.Producer
		err error
	}
	kafka := make(chan warmed, 1)
	go func() {
		p, err := c.checkKafka(besideChecks)
		kafka <- warmed{p, err}
	}()
	repl := make(chan *pgconn.PgConn, 1)
	go func() {
		// A failure here is left to the first pipeline, which connects
		// again and reports it; the checks name most causes first.
		conn, _ := c.ConnectReplication(besideChecks)
		repl <- conn
	}()
	conn, found, err := c.checkPostgres(ctx, &h)
	if err != nil {
		cancel() // an unreachable broker need not hold up the Postgres error
	}
	// With two writable hosts in postgres.dsn the two connections may have
	// reached different servers: the first pipeline then opens the
	// replication connection beside conn.
	out := Checked{Schemas: found.schemas, Per: found.per, History: h, Conn: conn, Repl: BesideOrClose(conn, <-repl)}
	if found.slotHeld && out.Repl != nil {
		// The first pipeline will wait as a standby: give the walsender
		// place back at once.
		out.Repl.Close(context.Background())
		out.Repl = nil
	}
	k := <-kafka
	out.Producer = k.p
	switch {
	case err == nil:
		err = k.err
	case k.err != nil && !errors.Is(k.err, context.Canceled):
		err = fmt.Errorf("%w; also %w", err, k.err) // both are wrong: say so at once, in one line
	}
	if err != nil {
		out.Close()
		return Checked{History: h}, err
	}
	return out, nil
}

// found is what the Postgres checks learned.
type found struct {
	schemas  []router.Schema // of each outbox table
	per      []config.Config // each outbox table's configuration
	slotHeld bool            // another process is streaming from the slot
}

// checkPostgres checks the server, the role and the table, prepares the
// publication and slot, and returns its open connection with what it found.
func (c *Checker) checkPostgres(ctx context.Context, h *History) (*pgx.Conn, found, error) {
	conn, err := pg.Connect(ctx, c.cfg.Postgres)
	if err != nil {
		return nil, found{}, err
	}
	f, err := c.checkOn(ctx, conn, h)
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, found{}, err
	}
	return conn, f, nil
}

// checkOn is checkPostgres on an open connection.
func (c *Checker) checkOn(ctx context.Context, conn *pgx.Conn, h *History) (found, error) {
	if err := refuseStandby(ctx, conn); err != nil {
		return found{}, err
	}
	// Every host of postgres.dsn and postgres.standby_dsns is asked, beside
	// the checks, whether it is a primary: a fresh process has seen no
	// timeline, and the DSN's first writable host may be an old primary.
	probe, cancel := context.WithCancel(ctx)
	defer cancel()
	others := make(chan []pg.Primary, 1)
	go func() { others <- pg.Primaries(probe, c.cfg.Postgres, 5*time.Second) }()
	major, version, err := pg.ServerMajor(ctx, conn)
	if err != nil {
		return found{}, err
	}
	if err := checkFailoverVersion(major, version, c.cfg.Postgres.FailoverSlot); err != nil {
		return found{}, err
	}
	h.major = major
	if c.perErr != nil {
		return found{}, c.perErr
	}
	user, err := checkServer(ctx, conn)
	if err != nil {
		return found{}, err
	}
	fields, err := c.resolvePatterns(ctx, conn)
	if err != nil {
		return found{}, err
	}
	if err := c.refuseUnlogged(ctx, conn); err != nil {
		return found{}, err
	}
	schemas := make([]router.Schema, len(c.per))
	for i, t := range c.per {
		field := fields[i]
		if err := checkTable(ctx, conn, user, t.Postgres, router.Columns(t.Router), field); err != nil {
			return found{}, err
		}
		if schemas[i], err = checkColumnTypes(ctx, conn, t); err != nil {
			return found{}, err
		}
	}
	if err := c.refuseNested(ctx, conn); err != nil {
		return found{}, err
	}
	if err := RefuseSplitBrain(ctx, conn, h, <-others); err != nil {
		return found{}, err
	}
	slotHeld, err := c.ensureSlot(ctx, conn, h)
	return found{schemas: schemas, per: c.per, slotHeld: slotHeld}, err
}

// warnRecordedPatterns warns, for postgres.tables without a pattern, of
// patterns still recorded for the publication (an earlier outboxd migrate
// with patterns): the event trigger adds every new table they match to the
// publication, and outboxd, which does not list it, stops at its first row
// (review-patterns35 S2). A failed read is left to the checks that follow.
func (c *Checker) warnRecordedPatterns(ctx context.Context, conn *pgx.Conn) {
	pub := c.cfg.Postgres.Publication
	patterns, err := pg.RecordedPatterns(ctx, conn, pub)
	if err != nil {
		c.log.Debug("could not read the patterns recorded for the event trigger", "err", err)
		return
	}
	if len(patterns) > 0 {
		c.log.Warn("patterns are recorded for the event trigger for this publication, but postgres.tables has none: the trigger adds every new table they match to the publication, "+
			"and outboxd stops at its first row; run outboxd migrate with this configuration, as a superuser, to delete them",
			"publication", pub, "patterns", strings.Join(patterns, ","), "trigger", pg.TriggerName)
	}
}

// resolvePatterns reads the tables of postgres.tables from the catalogue
// when an entry is a pattern (pg.MatchTables), making them c.per, and
// refuses a pattern without the event trigger that adds the tables it
// matches as they are created. It returns the setting that names each
// table of c.per, for messages.
func (c *Checker) resolvePatterns(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	pc := c.cfg.Postgres
	fields := make([]string, len(c.per))
	if !pc.Patterns() {
		for i := range fields {
			fields[i] = "postgres.table"
			if pc.Several() {
				fields[i] = fmt.Sprintf("postgres.tables[%d]", i)
			}
		}
		c.warnRecordedPatterns(ctx, conn)
		return fields, nil
	}
	if err := pg.CheckTrigger(ctx, conn, pc); err != nil {
		return nil, err
	}
	ms, err := pg.MatchTables(ctx, conn, pc.Tables)
	if err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("postgres.tables matches no table yet (%s), and outboxd creates its publication FOR TABLE the tables it matches: "+
			"create one of them first (outboxd migrate creates the exact names), or create the publication yourself (CREATE PUBLICATION %s WITH (publish = '%s', publish_via_partition_root = true))",
			pc.EntryNames(), pgx.Identifier{pc.Publication}.Sanitize(), wal.PublishActions)
	}
	names, entries := make([]string, len(ms)), make([]int, len(ms))
	fields = make([]string, len(ms))
	for i, m := range ms {
		names[i], entries[i] = m.Name(), m.Entry
		fields[i] = EntryField(pc, m.Entry)
	}
	per, err := c.cfg.PerTableOf(names, entries)
	if err != nil {
		return nil, err
	}
	c.per = per
	c.log.Info("outbox tables of postgres.tables", "tables", pg.MatchNames(ms))
	return fields, nil
}

// EntryField names entry i of postgres.tables for a message about one of
// its tables: postgres.tables[i], with the pattern when it is one.
func EntryField(pc config.Postgres, i int) string {
	if e := pc.Tables[i]; e.Pattern() {
		return fmt.Sprintf("postgres.tables[%d] (pattern %s)", i, e.Name)
	}
	return fmt.Sprintf("postgres.tables[%d]", i)
}

// CheckOutbox checks, on conn, the outbox table of cfg as the start-up
// checks do (it exists, the role may read it, its columns and their types
// fit its router) and returns the table schema its router is built from;
// field names the setting that gave the table. The pipeline runs it on a
// table a pattern matches that was created while outboxd runs.
func CheckOutbox(ctx context.Context, conn *pgx.Conn, cfg config.Config, field string) (router.Schema, error) {
	var user string
	if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil {
		return router.Schema{}, fmt.Errorf("reading the current role: %w", err)
	}
	if err := checkTable(ctx, conn, user, cfg.Postgres, router.Columns(cfg.Router), field); err != nil {
		return router.Schema{}, err
	}
	return checkColumnTypes(ctx, conn, cfg)
}

// checkKafka checks that a broker answers and returns the warmed client.
func (c *Checker) checkKafka(ctx context.Context) (*sink.Producer, error) {
	p, err := c.newProducer()
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := p.Warm(pctx); err != nil {
		p.Close()
		return nil, kafkaError(c.cfg.Kafka, err)
	}
	return p, nil
}

// kafkaError rewrites a failed broker check whose cause is the SASL
// credentials or the brokers' certificate into a line that names the
// settings to fix (never the password).
func kafkaError(cfg config.Kafka, err error) error {
	if err == nil {
		return nil
	}
	cause := err
	if u := errors.Unwrap(err); u != nil {
		cause = u // the reason, without the hint about kafka.brokers
	}
	brokers := strings.Join(cfg.Brokers, ",")
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return fmt.Errorf("the Kafka brokers %s rejected the SASL credentials for user %s (%s): %w; check kafka.sasl.username and kafka.sasl.password (or kafka.sasl.password_file), and that the user exists on the brokers for %[3]s",
			brokers, cfg.SASL.Username, cfg.SASL.Mechanism, cause)
	case errors.As(err, &unknownCA):
		return fmt.Errorf("cannot reach Kafka brokers %s: %w; their certificate is not signed by a CA in kafka.tls.ca_file (empty: the system's CAs): set it to the CA that signed the brokers' certificates",
			brokers, cause)
	case errors.As(err, &hostname):
		return fmt.Errorf("cannot reach Kafka brokers %s: %w; their certificate does not name the host dialled: use a broker address the certificate names, or set kafka.tls.server_name",
			brokers, cause)
	}
	return err
}

// checkServer checks the server's wal_level and the role's REPLICATION,
// and returns the role's name.
func checkServer(ctx context.Context, conn *pgx.Conn) (user string, err error) {
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return "", fmt.Errorf("reading wal_level: %w", err)
	}
	if walLevel != "logical" {
		return "", fmt.Errorf("wal_level is %s; set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart Postgres "+
			"(on Amazon RDS and Aurora: rds.logical_replication = 1 in the parameter group; on Google Cloud SQL: the flag cloudsql.logical_decoding = on; "+
			"on Azure Database for PostgreSQL: the server parameter wal_level = logical)", walLevel)
	}
	var canReplicate bool
	// On Amazon RDS and Aurora, membership of rds_replication stands for
	// the REPLICATION attribute, which no one can give there.
	err = conn.QueryRow(ctx, `SELECT current_user, rolreplication OR rolsuper OR EXISTS (
			SELECT FROM pg_roles r WHERE r.rolname = 'rds_replication' AND pg_has_role(current_user, r.oid, 'MEMBER'))
		FROM pg_roles WHERE rolname = current_user`).Scan(&user, &canReplicate)
	if err != nil {
		return "", fmt.Errorf("reading the role's attributes: %w", err)
	}
	if !canReplicate {
		role := pgx.Identifier{user}.Sanitize()
		return "", fmt.Errorf("role %s lacks the REPLICATION attribute; run ALTER ROLE %s WITH REPLICATION (on Amazon RDS and Aurora: GRANT rds_replication TO %s), or connect as a role that has it", user, role, role)
	}
	return user, nil
}

// checkTable checks that the outbox table cfg.Table exists, that role user
// may read it, and that it has the columns its router reads; field is the
// setting that names the table (postgres.table, postgres.tables[i]).
func checkTable(ctx context.Context, conn *pgx.Conn, user string, cfg config.Postgres, columns []string, field string) error {
	schema, table := cfg.TableName()
	present, err := pg.TableColumns(ctx, conn, schema, table)
	if errors.Is(err, pgx.ErrNoRows) {
		if field != "postgres.table" {
			return wal.Errorf(pg.ErrNoTable, "outbox table %s (%s) does not exist; create it, or correct %[2]s (compared exactly: no quotes, case as in the catalogue)", cfg.Table, field)
		}
		return wal.Errorf(pg.ErrNoTable, "outbox table %s does not exist; run 'outboxd migrate' to create it, or set postgres.table to your outbox table", cfg.Table)
	}
	if err != nil {
		return fmt.Errorf("reading outbox table %s: %w", cfg.Table, err)
	}
	// The column list above is read from the catalog, which any role may
	// read; reading the table's rows needs USAGE on its schema and SELECT.
	var schemaUsage, tableSelect bool
	err = conn.QueryRow(ctx, `SELECT has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		schema, table).Scan(&schemaUsage, &tableSelect)
	if err != nil {
		return fmt.Errorf("reading the role's privileges on %s: %w", cfg.Table, err)
	}
	role := pgx.Identifier{user}.Sanitize()
	if !schemaUsage {
		return wal.Errorf(pg.ErrNoPrivilege, "role %s lacks USAGE on schema %s; run GRANT USAGE ON SCHEMA %s TO %s (see migrations/roles/least_privilege.sql)",
			user, schema, pgx.Identifier{schema}.Sanitize(), role)
	}
	if !tableSelect {
		return wal.Errorf(pg.ErrNoPrivilege, "role %s lacks SELECT on the outbox table %s; run GRANT SELECT ON %s TO %s (see migrations/roles/least_privilege.sql)",
			user, cfg.Table, pgx.Identifier{schema, table}.Sanitize(), role)
	}
	if missing := pg.MissingColumns(present, columns); len(missing) > 0 {
		settings := "the router.*_column settings"
		if field != "postgres.table" {
			settings = "the *_column settings of " + field + ".router (or of the top-level router)"
		}
		return fmt.Errorf("outbox table %s has no column %s; add it or set %s to the table's column names",
			cfg.Table, strings.Join(missing, ", "), settings)
	}
	return nil
}

// checkColumnTypes reads the base type of each outbox column (through
// domains) and lets a router built on them refuse the ones its settings
// cannot use; it returns the schema the router is built from. It
// reads the key column's nullability, type modifier and default with them,
// which Debezium's key depends on: its key schema is optional when the key
// column may be NULL (as pgjdbc tells it: the column's or its domain's NOT
// NULL) and carries the column's default; a numeric's declared scale
// decides its form.
func checkColumnTypes(ctx context.Context, conn *pgx.Conn, cfg config.Config) (router.Schema, error) {
	schema, table := cfg.Postgres.TableName()
	rows, err := conn.Query(ctx, `WITH RECURSIVE b(name, oid, typmod, not_null, def, domain) AS (
			SELECT a.attname::text, a.atttypid, a.atttypmod, a.attnotnull OR (t.typtype = 'd' AND t.typnotnull),
				coalesce(pg_get_expr(d.adbin, d.adrelid), ''), t.typtype = 'd'
			FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
			LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
			WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
			UNION ALL
			SELECT b.name, t.typbasetype, CASE WHEN b.typmod = -1 THEN t.typtypmod ELSE b.typmod END, b.not_null, b.def, b.domain
			FROM b JOIN pg_type t ON t.oid = b.oid WHERE t.typtype = 'd')
		SELECT b.name, b.oid, b.typmod, b.not_null, b.def, b.domain FROM b JOIN pg_type t ON t.oid = b.oid WHERE t.typtype <> 'd'`,
		pgx.Identifier{schema, table}.Sanitize())
	if err != nil {
		return router.Schema{}, fmt.Errorf("reading the column types of %s: %w", cfg.Postgres.Table, err)
	}
	types := map[string]uint32{}
	var name, def string
	var oid uint32
	var typmod int32
	var notNull, domain bool
	key := router.KeyColumn{}
	_, err = pgx.ForEachRow(rows, []any{&name, &oid, &typmod, &notNull, &def, &domain}, func() error {
		types[name] = oid
		if name == cfg.Router.KeyColumn {
			key = router.KeyColumn{Optional: !notNull, TypeMod: typmod, Default: def, Domain: domain}
		}
		return nil
	})
	if err != nil {
		return router.Schema{}, fmt.Errorf("reading the column types of %s: %w", cfg.Postgres.Table, err)
	}
	tableSchema := router.Schema{Key: key}
	rt, err := router.New(cfg.Router, tableSchema)
	if err != nil {
		return router.Schema{}, fmt.Errorf("outbox table %s: %w", cfg.Postgres.Table, err)
	}
	return tableSchema, rt.CheckTypes(cfg.Postgres.Table, types)
}

// ensureSlot creates the publication and slot when missing and allowed, and
// refuses an unusable slot; slotHeld reports a slot that another process is
// streaming from.
func (c *Checker) ensureSlot(ctx context.Context, conn *pgx.Conn, h *History) (slotHeld bool, err error) {
	pc := c.cfg.Postgres
	var pubs []wal.Publication
	if c.shard.Count > 1 { // no pattern (config.Config.Validate)
		pubs, err = c.checkShardPublication(ctx, conn)
	} else {
		pubs, err = ensurePublication(ctx, conn, pc, c.tables())
	}
	if err != nil {
		return false, err
	}
	for i, pub := range pubs {
		if pub.Columns == nil {
			continue
		}
		if missing := pg.MissingColumns(pub.Columns, router.Columns(c.per[i].Router)); len(missing) > 0 {
			schema, table := c.per[i].Postgres.TableName()
			return false, wal.ColumnListError(pc.Publication, schema, table, pub.Columns, missing)
		}
	}
	if pc.Several() && !pubs[0].Created {
		if err := c.refuseOthers(ctx, conn); err != nil {
			return false, err
		}
	}
	pub := pubs[0] // publish settings are the publication's, the same for each table
	switch {
	case pub.Created:
		c.log.Info("created publication", "publication", pc.Publication, "table", c.tableNames(), "publish", wal.PublishActions)
	case pub.NoUpdates && c.cfg.Router.OnUpdate != "ignore" && c.shard.Count == 1: // a shard's publication publishes inserts only
		c.log.Warn("the publication leaves UPDATEs out, so router.on_update ("+string(c.cfg.Router.OnUpdate)+") never sees an updated outbox row; "+
			wal.AlterPublicationSQL(pc.Publication)+" publishes them", "publication", pc.Publication)
	case pub.Deletes:
		c.log.Info("the publication publishes DELETEs, which outboxd ignores; if rows are deleted after insert, Postgres decodes and sends "+
			"every delete for nothing. Unless another reader of the publication needs them, "+wal.AlterPublicationSQL(pc.Publication)+
			" leaves them out from that point in the WAL, on the same slot", "publication", pc.Publication)
	}
	info, ok, err := inspectAtStart(ctx, conn, c.cfg, c.log, c.ConnectReplication, wal.InspectSlot)
	if err != nil {
		return false, err
	}
	if !ok {
		if err := c.refuseAfterPromotion(ctx, conn); err != nil {
			return false, err
		}
		if !pc.CreateSlot {
			return false, wal.Errorf(wal.ErrSlotMissing, "replication slot %q does not exist; set postgres.create_slot: true, or create it with %s",
				pc.Slot, wal.CreateSlotSQL(pc.Slot, pc.FailoverSlot))
		}
		lsn, err := wal.CreateSlot(ctx, conn, pc.Slot, pc.FailoverSlot)
		if err != nil {
			return false, err
		}
		c.log.Info("created replication slot; events committed from here on will be delivered", "slot", pc.Slot, "lsn", lsn.String(), "failover", pc.FailoverSlot)
		info = wal.SlotInfo{Name: pc.Slot, Failover: pc.FailoverSlot, ConfirmedFlushLSN: lsn}
		if err := c.noteSlot(ctx, conn, info, h); err != nil {
			return false, err
		}
		c.logFailover(ctx, conn, h.major, info)
		return false, nil
	}
	// Noted here too for an instance that starts as a standby (another
	// holds the slot), whose pipeline starts see only a held slot.
	if err := c.noteSlot(ctx, conn, info, h); err != nil {
		return false, err
	}
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		return false, fmt.Errorf("reading current database: %w", err)
	}
	err = c.checkSlot(ctx, conn, info, db)
	var active *wal.SlotActiveError
	if errors.As(err, &active) {
		c.log.Warn(err.Error(), "slot", pc.Slot)
		slotHeld = true
	} else if err != nil {
		return false, err
	}
	if pc.FailoverSlot && !info.Failover && !slotHeld { // a held slot cannot be altered; its holder alters it at its start
		// As Debezium does with slot.failover: the slot keeps its position.
		if err := c.alterToFailover(ctx); err != nil {
			c.log.Warn("the slot is not a failover slot and could not be altered to one; run "+wal.AlterSlotFailoverSQL(pc.Slot)+
				" on a replication connection (psql \"dbname=... replication=database\") while outboxd is stopped",
				"slot", pc.Slot, "err", err)
		} else {
			info.Failover = true
			c.log.Info("altered the replication slot to a failover slot (postgres.failover_slot: true)", "slot", pc.Slot)
		}
	}
	c.logFailover(ctx, conn, h.major, info)
	return slotHeld, nil
}

// ensurePublication creates the publication FOR TABLE tables, the ones
// postgres.tables named when the start-up checks listed them, or checks
// the one there (wal.EnsurePublicationOf). A publication it creates for
// patterns it checks again: the event trigger skips a table created while
// the publication does not exist, so a table a pattern matches, created
// after the tables were listed and before the publication was, would be in
// neither (review-patterns35 S4). Such a table is refused, naming it, with
// the ADD TABLE that publishes it: outboxd does not add it itself, for the
// table is not checked against its entry, and its rows written before the
// ADD TABLE are not published (before the slot is created that loses
// nothing: the slot starts after them). A table whose creating transaction
// is still open is not seen here; the check while streaming (tables.Watch)
// finds it unpublished.
func ensurePublication(ctx context.Context, conn *pgx.Conn, pc config.Postgres, tables []wal.Table) ([]wal.Publication, error) {
	pubs, err := wal.EnsurePublicationOf(ctx, conn, pc.Publication, tables, pc.CreatePublication)
	if err != nil || !pc.Patterns() || len(pubs) == 0 || !pubs[0].Created {
		return pubs, err
	}
	ms, err := pg.MatchTables(ctx, conn, pc.Tables)
	if err != nil {
		return nil, err
	}
	listed := map[string]bool{}
	for _, t := range tables {
		listed[t.String()] = true
	}
	var late, quoted []string
	for _, m := range ms {
		if t := (wal.Table{Schema: m.Schema, Name: m.Table}); !listed[t.String()] {
			late = append(late, t.String())
			quoted = append(quoted, pgx.Identifier{m.Schema, m.Table}.Sanitize())
		}
	}
	if len(late) == 0 {
		return pubs, nil
	}
	return nil, fmt.Errorf("%s, which postgres.tables matches, was created after outboxd listed the tables it matches and before it created publication %q, "+
		"so neither outboxd nor the event trigger %s (which skips a publication that does not exist yet) put it into the publication: "+
		"run ALTER PUBLICATION %s ADD TABLE %s and start outboxd again (rows written to it before that statement are not published: "+
		"if the replication slot existed before this start, send them with outboxd replay -table)",
		strings.Join(late, ", "), pc.Publication, pg.TriggerName, quote.Ident(pc.Publication), strings.Join(quoted, ", "))
}

// inspectSlot reads a slot: wal.InspectSlot, or a test's wrapper of it.
type inspectSlot func(ctx context.Context, conn *pgx.Conn, slot string) (wal.SlotInfo, bool, error)

// inspectAtStart inspects the slot at start-up. With postgres.backfill (one
// slot, config.Config.Validate) it first makes the slot with its snapshot
// exported, or checks the one there (backfill.Prepare). Without, it refuses
// a slot whose backfill is not done (backfill.RefuseUnfinished), reading
// the backfill's state after the slot: a backfill commits its state before
// it creates its slot, and deletes it only after dropping the slot, so a
// slot seen before the state is read shows its backfill's state. Read the
// other way round, a backfill that records itself and makes the slot in
// between would have its slot streamed by this process while it still
// sends the older rows: the same key's events out of order (review-bf36 R2).
func inspectAtStart(ctx context.Context, conn *pgx.Conn, cfg config.Config, log *slog.Logger,
	openRepl func(context.Context) (*pgconn.PgConn, error), inspect inspectSlot) (wal.SlotInfo, bool, error) {
	if cfg.Postgres.Backfill.On() {
		if err := backfill.Prepare(ctx, conn, openRepl, cfg, log); err != nil {
			return wal.SlotInfo{}, false, err
		}
		return inspect(ctx, conn, cfg.Postgres.Slot)
	}
	info, ok, err := inspect(ctx, conn, cfg.Postgres.Slot)
	if err != nil {
		return wal.SlotInfo{}, false, err
	}
	if err := backfill.RefuseUnfinished(ctx, conn, cfg, log); err != nil {
		return wal.SlotInfo{}, false, err
	}
	return info, ok, nil
}

// checkShardPublication checks that a shard's publication, made before the
// shards start (Shards.Start, which also checks each row filter's
// meaning), publishes every outbox table with a row filter, and returns
// each table's column list, in the order of c.per. A table missing from
// it, or published without a filter, is refused with the statement that
// fixes it: rows of it committed before the fix reached no shard, or
// every shard.
func (c *Checker) checkShardPublication(ctx context.Context, conn *pgx.Conn) ([]wal.Publication, error) {
	pc := c.cfg.Postgres
	tables := c.shardTables()
	if err := c.checkShardOptions(ctx, conn, tables); err != nil {
		return nil, err
	}
	pubs := make([]wal.Publication, len(tables))
	for i, t := range tables {
		var filter *string
		var columns []string
		err := conn.QueryRow(ctx, `SELECT to_jsonb(pt) ->> 'rowfilter', coalesce(to_jsonb(pt) -> 'attnames', 'null')
			FROM pg_publication_tables pt WHERE pt.pubname = $1 AND pt.schemaname = $2 AND pt.tablename = $3`,
			pc.Publication, t.Schema, t.Name).Scan(&filter, &columns)
		switch {
		case errors.Is(err, pgx.ErrNoRows) && len(tables) == 1:
			return nil, wal.Errorf(wal.ErrPublicationMissing, "publication %q of shard %d of %d does not exist or does not include %s; drop it if it exists and create it with %s",
				pc.Publication, c.shard.Index, c.shard.Count, t, shard.PublicationSQL(pc.Publication, tables, c.shard.Index, c.shard.Count))
		case errors.Is(err, pgx.ErrNoRows):
			add, aerr := c.addTablesSQL(ctx, conn, tables)
			if aerr != nil {
				return nil, aerr
			}
			if add == "" {
				add = "(none lacks it but this one, which does not exist)"
			}
			return nil, wal.Errorf(wal.ErrPublicationMissing, "publication %q of shard %d of %d does not exist or does not include %s, so none of its rows whose key hashes to shard %d reach outboxd; "+
				"add the tables to every shard's publication at once (of both shard counts while a reshard is recorded), with outboxd stopped and before the application first writes them, with %s (rows of them written before are not delivered: send them with outboxd replay), or, if the publication does not exist, create it with %s",
				pc.Publication, c.shard.Index, c.shard.Count, t, c.shard.Index,
				add, shard.PublicationSQL(pc.Publication, tables, c.shard.Index, c.shard.Count))
		case err != nil:
			return nil, fmt.Errorf("reading tables of publication %q: %w", pc.Publication, err)
		case filter == nil:
			return nil, fmt.Errorf("publication %q of shard %d of %d publishes every row of %s, so every shard would deliver every event of it; give it its filter with %s",
				pc.Publication, c.shard.Index, c.shard.Count, t, shard.RefilterSQL(pc.Publication, []shard.Table{t}, nil, c.shard.Index, c.shard.Count))
		}
		pubs[i] = wal.Publication{Columns: columns}
	}
	if !pc.Several() {
		if err := c.refuseShardedOthers(ctx, conn); err != nil {
			return nil, err
		}
	}
	return pubs, nil
}

// addTablesSQL returns the one transaction that adds each of tables to
// every existing publication of this shard count that lacks it
// (shard.AddLacksSQL): added one shard at a time, each shard would miss
// its rows written before its own ADD (second review of issue 35 §1, S6).
// While a reshard is recorded, that is every existing publication of both
// its shard counts: the old shards deliver the rows up to the cutover, the
// new ones those after it (third review, S2).
func (c *Checker) addTablesSQL(ctx context.Context, conn *pgx.Conn, tables []shard.Table) (string, error) {
	suffix := fmt.Sprintf("_%dof%d", c.shard.Index, c.shard.Count)
	base := strings.TrimSuffix(c.cfg.Postgres.Publication, suffix)
	pc := c.cfg.Postgres
	pc.Slot = strings.TrimSuffix(pc.Slot, suffix)
	plan, err := reshard.ReadPlan(ctx, conn, pc)
	if err != nil {
		return "", err
	}
	counts := []int{c.shard.Count}
	if plan != nil {
		counts = []int{plan.From, plan.To}
	}
	var lacks []shard.Lack
	for _, n := range counts {
		pubs, err := shard.Names(base, n)
		if err != nil {
			return "", fmt.Errorf("postgres.publication: %w", err)
		}
		for j, pub := range pubs {
			l := shard.Lack{Publication: pub, I: j, N: n}
			for _, t := range tables {
				var lacking bool
				err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)
					AND NOT EXISTS (SELECT FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)`, pub, t.Schema, t.Name).Scan(&lacking)
				if err != nil {
					return "", fmt.Errorf("reading tables of publication %q: %w", pub, err)
				}
				if lacking {
					l.Tables = append(l.Tables, t)
				}
			}
			lacks = append(lacks, l)
		}
	}
	return shard.AddLacksSQL(lacks), nil
}

// checkShardOptions refuses a shard publication that does not publish
// inserts (nothing would reach outboxd, and nothing else would say so), or
// that publishes a partitioned outbox table under each partition's name,
// where each partition's own row filter (none) applies, so every shard
// would deliver its rows (second review of issue 35 §1, S3). Both with
// one transaction of shard.OptionsSQL over every publication of this
// shard count that is wrong: put right one at a time, the shards not yet
// put right would go on losing or repeating the rows in between (third
// review, S3). A missing publication is left to the caller.
func (c *Checker) checkShardOptions(ctx context.Context, conn *pgx.Conn, tables []shard.Table) error {
	pc := c.cfg.Postgres
	var inserts, viaRoot bool
	err := conn.QueryRow(ctx, `SELECT pubinsert, pubviaroot FROM pg_publication WHERE pubname = $1`, pc.Publication).Scan(&inserts, &viaRoot)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("reading publication %q: %w", pc.Publication, err)
	}
	var partitioned *shard.Table
	for _, t := range tables {
		var is bool
		if err := conn.QueryRow(ctx, `SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)`, t.String()).Scan(&is); err != nil {
			return fmt.Errorf("reading outbox table %s: %w", t, err)
		}
		if is {
			partitioned = &t
			break
		}
	}
	if inserts && (viaRoot || partitioned == nil) {
		return nil
	}
	stmt, err := c.optionsSQL(ctx, conn, partitioned != nil)
	if err != nil {
		return err
	}
	fix := "put the options of every shard publication that has them wrong right at once, with outboxd stopped: " + stmt
	if !inserts {
		return fmt.Errorf("publication %q of shard %d of %d does not publish INSERTs, so no event of this shard reaches outboxd; %s. "+
			"The rows of this shard written while it did not publish INSERTs reached no slot: send them with outboxd replay",
			pc.Publication, c.shard.Index, c.shard.Count, fix)
	}
	return fmt.Errorf("the outbox table %s is partitioned, and publication %q of shard %d of %d publishes its rows under each partition's name, where each partition's own row filter (none) applies, so every shard would deliver them; %s. "+
		"Rows written before it are decoded with the old setting even after it: each shard whose publication lacked it delivers them all, so they are repeated, out of order across shards",
		*partitioned, pc.Publication, c.shard.Index, c.shard.Count, fix)
}

// optionsSQL returns the one transaction of shard.OptionsSQL over every
// existing publication of this shard count that does not publish inserts
// or, when an outbox table is partitioned, does not publish via its root.
func (c *Checker) optionsSQL(ctx context.Context, conn *pgx.Conn, partitioned bool) (string, error) {
	base := strings.TrimSuffix(c.cfg.Postgres.Publication, fmt.Sprintf("_%dof%d", c.shard.Index, c.shard.Count))
	pubs, err := shard.Names(base, c.shard.Count)
	if err != nil {
		return "", fmt.Errorf("postgres.publication: %w", err)
	}
	rows, err := conn.Query(ctx, `SELECT pubname::text FROM pg_publication WHERE pubname = ANY($1) AND (NOT pubinsert OR (NOT pubviaroot AND $2))
		ORDER BY array_position($1, pubname::text)`, pubs, partitioned)
	if err != nil {
		return "", fmt.Errorf("reading the options of the shard publications: %w", err)
	}
	var stmts []string
	var name string
	if _, err := pgx.ForEachRow(rows, []any{&name}, func() error {
		stmts = append(stmts, shard.OptionsSQL(name))
		return nil
	}); err != nil {
		return "", fmt.Errorf("reading the options of the shard publications: %w", err)
	}
	return shard.TxSQL(stmts), nil
}

// refuseShardedOthers refuses, with one outbox table, another table in the
// shard publication that carries outboxd's row filter of this shard on one
// of its text or varchar columns (shard.FilterCheckSQL agrees on every
// test key; shard 0's from before NULL keys had a shard counts too): an
// outbox table of a deployment with several postgres.tables, such as one
// rolled back to postgres.table. With one table the pipeline passes over
// the rows of another table in a shared publication, and the slot confirms
// past them: they would never be delivered. Another table without that
// filter is the user's business and passes (review of issue 35 §1, S4).
func (c *Checker) refuseShardedOthers(ctx context.Context, conn *pgx.Conn) error {
	pc := c.cfg.Postgres
	schema, table := pc.TableName()
	rows, err := conn.Query(ctx, `SELECT pt.schemaname::text, pt.tablename::text, to_jsonb(pt) ->> 'rowfilter',
			array(SELECT a.attname::text FROM pg_attribute a
				WHERE a.attrelid = format('%I.%I', pt.schemaname, pt.tablename)::regclass AND a.attnum > 0 AND NOT a.attisdropped
					AND a.atttypid IN ('text'::regtype, 'varchar'::regtype) ORDER BY a.attnum)
		FROM pg_publication_tables pt WHERE pt.pubname = $1 AND to_jsonb(pt) ->> 'rowfilter' IS NOT NULL AND (pt.schemaname, pt.tablename) <> ($2, $3)`,
		pc.Publication, schema, table)
	if err != nil {
		return fmt.Errorf("reading tables of publication %q: %w", pc.Publication, err)
	}
	type other struct {
		table   shard.Table
		filter  string
		columns []string
	}
	var others []other
	var o other
	_, err = pgx.ForEachRow(rows, []any{&o.table.Schema, &o.table.Name, &o.filter, &o.columns}, func() error {
		others = append(others, o)
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading tables of publication %q: %w", pc.Publication, err)
	}
	for _, o := range others {
		for _, col := range o.columns {
			var fc shard.FilterCheck
			err := conn.QueryRow(ctx, shard.FilterCheckSQL(o.filter, col, c.shard.Index, c.shard.Count)).Scan(fc.Fields()...)
			switch {
			case err != nil && !otherColumn(err):
				return fmt.Errorf("checking the row filter of %s in publication %q: %w", o.table, pc.Publication, err)
			case err != nil || fc.KeysDiffer > 0:
				continue
			}
			return fmt.Errorf("publication %q of shard %d of %d also publishes %s with outboxd's shard filter on its column %q, but postgres.tables does not list it: "+
				"its rows reach this shard's slot, and with one outbox table outboxd passes over them, so they would never be delivered. "+
				"If it is an outbox table, list it in postgres.tables; if not, remove it from the shard publications with ALTER PUBLICATION %s DROP TABLE %s (and from the other shards' ones)",
				pc.Publication, c.shard.Index, c.shard.Count, o.table, col, pgx.Identifier{pc.Publication}.Sanitize(), o.table)
		}
	}
	return nil
}

// otherColumn reports the error of shard.FilterCheckSQL for a filter on
// another column than the one tried: undefined_column, or
// undefined_function (hashtext of a column of another type). Any other
// error, such as a cancel or a serialization failure, says nothing about
// the filter.
func otherColumn(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42703" || pgErr.Code == "42883")
}

// shardTables are the outbox tables with their key columns, as the shard
// publications list them.
func (c *Checker) shardTables() []shard.Table { return config.ShardTablesOf(c.per) }

// tables are the outbox tables.
func (c *Checker) tables() []wal.Table {
	out := make([]wal.Table, len(c.per))
	for i, t := range c.per {
		schema, table := t.Postgres.TableName()
		out[i] = wal.Table{Schema: schema, Name: table}
	}
	return out
}

// tableNames are the outbox tables' names, comma-separated, for messages.
func (c *Checker) tableNames() string {
	names := make([]string, len(c.per))
	for i, t := range c.per {
		names[i] = t.Postgres.Table
	}
	return strings.Join(names, ",")
}

// refuseOthers refuses a publication, of several outbox tables, that also
// publishes a table postgres.tables does not list: outboxd would meet rows
// it has no router for, and with several tables it halts on them rather
// than guess whether they are events (package tables).
func (c *Checker) refuseOthers(ctx context.Context, conn *pgx.Conn) error {
	pc := c.cfg.Postgres
	listed := map[string]bool{}
	for _, t := range c.tables() {
		listed[t.String()] = true
	}
	rows, err := conn.Query(ctx, `SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2`, pc.Publication)
	if err != nil {
		return fmt.Errorf("reading tables of publication %q: %w", pc.Publication, err)
	}
	var others []string
	var schema, table string
	_, err = pgx.ForEachRow(rows, []any{&schema, &table}, func() error {
		if t := (wal.Table{Schema: schema, Name: table}); !listed[t.String()] {
			others = append(others, t.String())
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading tables of publication %q: %w", pc.Publication, err)
	}
	if len(others) > 5 {
		others = append(others[:5], fmt.Sprintf("and %d more", len(others)-5))
	}
	var all bool
	if err := conn.QueryRow(ctx, `SELECT puballtables FROM pg_publication WHERE pubname = $1`, pc.Publication).Scan(&all); err != nil {
		return fmt.Errorf("reading publication %q: %w", pc.Publication, err)
	}
	if all {
		return fmt.Errorf("publication %q is FOR ALL TABLES, so it publishes tables postgres.tables does not list (%s); with several outbox tables outboxd halts on a row of a table it has no router for: "+
			"give outboxd a publication of its own (drop %[1]q and let outboxd create it, or create it FOR TABLE the listed tables)", pc.Publication, strings.Join(others, ", "))
	}
	if len(others) > 0 {
		return fmt.Errorf("publication %q also publishes %s, which postgres.tables does not list; with several outbox tables outboxd halts on a row of a table it has no router for: "+
			"list the table under postgres.tables if its rows are events, else remove it from the publication (ALTER PUBLICATION %s DROP TABLE ...) or give outboxd a publication of its own",
			pc.Publication, strings.Join(others, ", "), pgx.Identifier{pc.Publication}.Sanitize())
	}
	return nil
}
