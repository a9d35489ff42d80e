package delivery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/preflight"
	"github.com/outboxd/outboxd/internal/quote"
	"github.com/outboxd/outboxd/internal/tables"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/shard"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// Setup is what one run's pipeline is built from.
type Setup struct {
	Config     config.Config
	Log        *slog.Logger
	Metrics    *Metrics
	TxnMetrics *sink.TxnMetrics // exactly_once only
	// Shard is the relay's shard of the configured layout (Index 0 of
	// Count 1 when unsharded): a sharded pipeline delivers only its
	// shard's logical messages.
	Shard shard.Shard
	// Window is the relay's reshard window with the end the reshard gate
	// gave the run; StopReading, called when the pipeline meets its end,
	// ends the stream at the next transaction boundary.
	Window      shard.Window
	StopReading func()
	// Timeline is the server's timeline as the run's inspection left it,
	// for exactly-once positions.
	Timeline int
	// Tracker registers the run's transactions and records; Producer
	// takes its records; a record that fails calls Fail with its error.
	Tracker  *checkpoint.Tracker
	Producer Producer
	Fail     context.CancelCauseFunc
	// OutboxIDs are the outbox tables' relation IDs when the run started
	// (0: not known) and Schemas the table schemas their routers are built
	// from, in the order of Config.PerTable; the catalogue lookups read the
	// server at Addr.
	OutboxIDs []uint32
	Addr      string
	Schemas   []router.Schema
	// Per is each outbox table's configuration as the start-up checks
	// found them (preflight.Checked.Per: with patterns, the tables they
	// matched); nil: Config.PerTable.
	Per []config.Config
	// Learnt (nil: none) is told each table the pipeline takes on while
	// it streams (a table a pattern matches), with its relation ID (0:
	// unknown), once its router is built.
	Learnt func(schema, name string, id uint32)
}

// NewPipeline returns the pipeline of one run, on ctx: it routes the
// stream's items and hands the records to s.Producer, registering each with
// s.Tracker first. Only the goroutine that calls Run, RunExactlyOnce or
// Handle may use it; Close it after.
func NewPipeline(ctx context.Context, s Setup) (*Pipeline, error) {
	per := s.Per
	if per == nil {
		var err error
		if per, err = s.Config.PerTable(); err != nil {
			return nil, err
		}
	}
	outboxes := make([]table, len(per))
	for i, c := range per {
		var schema router.Schema
		if i < len(s.Schemas) {
			schema = s.Schemas[i]
		}
		rt, err := router.New(c.Router, schema)
		if err != nil {
			return nil, fmt.Errorf("outbox table %s: %w", c.Postgres.Table, err)
		}
		schemaName, tableName := c.Postgres.TableName()
		outboxes[i] = table{cfg: c, router: rt, schema: schema, counts: s.Metrics.table(schemaName + "." + tableName)}
	}
	changes := s.Metrics.changes
	p := &Pipeline{cfg: s.Config, log: s.Log, m: s.Metrics, txnM: s.TxnMetrics, shard: s.Shard,
		ctx: ctx, tracker: s.Tracker, producer: s.Producer, fail: s.Fail, outboxes: outboxes,
		window: s.Window, timeline: s.Timeline, stopReading: s.StopReading, learnt: s.Learnt,
		takesUnowned: s.Config.Router.Messages.Unowned != config.UnownedIgnore,
		nontx:        changes.WithLabelValues("message_nontransactional", ""),
		others:       changes.WithLabelValues("message_other_outbox", ""), unowned: changes.WithLabelValues("message_unowned", "")}
	p.tables = tables.New(s.Config.Postgres, per, s.OutboxIDs, s.Log, s.Addr, p.learnBaseType, p.adopt)
	return p, nil
}

// adopt takes on name, a table created while the run streams that entry
// of postgres.tables (a pattern) matches: it checks the table on conn as
// the start-up checks do and builds its router from the entry's settings
// (tables.Adopt).
func (p *Pipeline) adopt(ctx context.Context, conn *pgx.Conn, entry int, name string, id uint32) error {
	per, err := p.cfg.PerTableOf([]string{name}, []int{entry})
	if err != nil {
		return err
	}
	c := per[0]
	schema, err := preflight.CheckOutbox(ctx, conn, c, preflight.EntryField(p.cfg.Postgres, entry))
	if err != nil {
		return err
	}
	rt, err := router.New(c.Router, schema)
	if err != nil {
		return fmt.Errorf("outbox table %s: %w", name, err)
	}
	p.outboxes = append(p.outboxes, table{cfg: c, router: rt, schema: schema, counts: p.m.table(name)})
	if p.learnt != nil {
		schemaName, tableName := c.Postgres.TableName()
		p.learnt(schemaName, tableName, id)
	}
	return nil
}

// table is one outbox table's configuration (postgres.table and router
// merged for it) and router.
type table struct {
	cfg config.Config
	// router routes the table's rows, built from schema: the table schema
	// the start-up checks read, with the domains the run met since.
	router *router.Router
	schema router.Schema
	counts // its series of the pipeline's metrics
}

// learnBaseType rebuilds outbox table i's router with one more domain,
// whose columns it reads as base: pgoutput names the domain.
func (p *Pipeline) learnBaseType(i int, domain, base uint32) error {
	o := &p.outboxes[i]
	bases := make(map[uint32]uint32, len(o.schema.Bases)+1)
	for d, b := range o.schema.Bases {
		bases[d] = b
	}
	bases[domain] = base
	schema := router.Schema{Key: o.schema.Key, Bases: bases}
	rt, err := router.New(o.cfg.Router, schema)
	if err != nil {
		return err
	}
	o.router, o.schema = rt, schema
	return nil
}

// Run handles every item of batches in order until the channel is closed
// or an item fails.
func (p *Pipeline) Run(batches <-chan []wal.Item) error {
	for batch := range batches {
		for _, item := range batch {
			if err := p.Handle(item); err != nil {
				return err
			}
		}
	}
	return nil
}

// Close closes the connection the pipeline opened for catalog lookups.
func (p *Pipeline) Close() { p.tables.Close() }

// Pipeline is the pipeline goroutine's state for one run.
type Pipeline struct {
	cfg      config.Config
	log      *slog.Logger
	m        *Metrics
	txnM     *sink.TxnMetrics // exactly_once only
	shard    shard.Shard
	ctx      context.Context
	tracker  *checkpoint.Tracker
	producer Producer
	fail     context.CancelCauseFunc
	tables   *tables.Outbox
	learnt   func(schema, name string, id uint32) // Setup.Learnt
	// outboxes are the outbox tables, in the order of config.Config.PerTable:
	// tables tells which one a change is of.
	outboxes []table
	// window is the relay's reshard window as the run took it.
	window   shard.Window
	timeline int          // the server's timeline as the run's inspection left it, for exactly-once positions
	eos      *ExactlyOnce // exactly_once only (eos.go)
	// takesUnowned: router.messages.unowned is deliver.
	takesUnowned bool

	txn          *checkpoint.Txn
	done         func(error) // the outcome of a record of txn
	commitTime   time.Time
	final        wal.LSN // the commit record's LSN of the transaction being received
	warnedUpdate bool
	warnedNontx  bool
	warnedOther  bool          // a message naming another outbox table was logged
	warnedLeft   bool          // an unowned message left (unowned: ignore) was logged
	rec          router.Record // each insert's record: the producer keeps none of it
	// pastWindow: an old shard met the end of its reshard window and
	// handles nothing more; stopReading ends the stream there.
	pastWindow  bool
	stopReading func()
	// before: the transaction being read ends at or before the window's
	// After (a new shard after a reshard): the old shards delivered it.
	before bool

	nontx   prometheus.Counter // non-transactional messages with the outbox prefix
	others  prometheus.Counter // messages naming another outbox table
	unowned prometheus.Counter // messages naming none, left (unowned: ignore)
}

// Handle routes one item of the stream: a Begin registers a transaction
// with the tracker (waiting for room), an insert or a logical message with
// the outbox prefix is delivered, an update follows router.on_update, a
// Commit closes the transaction at its end LSN, and a Keepalive lets an
// idle tracker advance.
func (p *Pipeline) Handle(item wal.Item) error {
	rcfg := p.cfg.Router
	if p.pastWindow {
		return nil // beyond an old shard's window: the new shards deliver it
	}
	if p.eos != nil && p.eos.Skipping() {
		return p.eos.Skip(item) // in Kafka before this run
	}
	switch m := item.(type) {
	case *wal.Begin:
		// The commit record starts at FinalLSN and ends at the transaction's
		// end LSN; a cutover is never inside a record, so the transaction
		// ends after it exactly when its commit starts at or after it.
		if w := p.window; w.Upto != 0 && w.Past(m.FinalLSN+1) {
			p.endWindow()
			return nil
		}
		if !m.SentTime.IsZero() {
			p.m.commitToSend.Observe(max(m.SentTime.Sub(m.CommitTime), 0).Seconds())
		}
		if p.eos != nil {
			if skip, err := p.eos.Begin(p.ctx, m); skip || err != nil {
				return err
			}
		}
		// Transactions wait for confirmation behind the oldest: cap them as
		// records are capped, or a partition that does not move while the
		// others acknowledge would grow the queue without bound.
		if err := p.tracker.WaitRoom(p.ctx, p.cfg.Kafka.MaxBufferedRecords); err != nil {
			return err
		}
		txn, fail := p.tracker.BeginAt(m.CommitTime), p.fail
		p.txn, p.commitTime, p.final = txn, m.CommitTime, m.FinalLSN
		// Delivered by the old shards: confirmed in order, nothing sent.
		p.before = m.FinalLSN < p.window.After
		if p.eos != nil {
			p.eos.Hold(txn)
		}
		// One callback per transaction, not per record.
		p.done = func(err error) {
			if err != nil {
				fail(err)
				return
			}
			txn.Ack()
		}
	case *wal.Change:
		if p.before {
			return nil
		}
		i, ours, err := p.tables.Which(p.ctx, m.Relation)
		if werr := (*wal.Error)(nil); errors.As(err, &werr) && errors.Is(err, tables.ErrUnrouted) {
			// Where the row is: the remedy's slot advance needs the end
			// of its transaction.
			werr.Msg += fmt.Sprintf(" (the row at LSN %s, xid %d, in the transaction whose commit record is at %s)", m.LSN, m.XID, p.final)
			werr.Remedy += fmt.Sprintf(". The advance past this transaction: SELECT pg_replication_slot_advance(%s, '%s'::pg_lsn + 1)",
				quote.Literal(p.cfg.Postgres.Slot), p.final)
		}
		if !ours || err != nil {
			return err // nil: another table in a shared publication (one outbox table only)
		}
		o := &p.outboxes[i]
		switch m.Op {
		case wal.Insert:
			o.inserts.Inc()
			err := o.router.RouteInto(m, &p.rec)
			return p.deliver(o, &p.rec, err, m.LSN, m.Relation.QualifiedName)
		case wal.Update:
			o.updates.Inc()
			switch onUpdate := o.cfg.Router.OnUpdate; {
			case onUpdate == config.OnUpdateError:
				return &wal.Error{Kind: ErrUpdate,
					Msg:    fmt.Sprintf("UPDATE of an outbox row at LSN %s (xid %d) and router.on_update is error; outbox rows must only be inserted", m.LSN, m.XID),
					Remedy: "to move past it, set router.on_update: warn or ignore and restart"}
			case onUpdate == config.OnUpdateWarn && !p.warnedUpdate:
				p.warnedUpdate = true
				p.log.Warn("UPDATE on the outbox table is not delivered; outbox rows should only be inserted (counted in outboxd_wal_changes_total{op=\"update\"})",
					"lsn", m.LSN.String(), "xid", m.XID, "table", o.cfg.Postgres.Table)
			}
		case wal.Delete:
			o.deletes.Inc() // insert-then-delete keeps the table empty; the insert was delivered
		}
	case *wal.Message:
		if rcfg.Messages.Prefix == "" || m.Prefix != rcfg.Messages.Prefix {
			return nil // not an outbox event
		}
		if !m.Transactional {
			// Emitted whether or not its transaction commits: not an
			// outbox event, but most likely a mistake to point out.
			if !p.warnedNontx {
				p.warnedNontx = true
				p.log.Warn("a non-transactional logical message with the outbox prefix is not delivered; write events with pg_logical_emit_message(true, ...) so that they are sent only if their transaction commits (counted in outboxd_wal_changes_total{op=\"message_nontransactional\"})",
					"lsn", m.LSN.String(), "prefix", m.Prefix)
			}
			p.nontx.Inc()
			return nil
		}
		if p.before {
			return nil
		}
		// Content that is not a JSON object, or whose owner is not a
		// string (err), names no owner and no key: it is delivered, as a
		// poison row, once, by the deployment and shard that take messages
		// without either.
		fields, err := router.ParseMessage(m)
		o, owned, oerr := p.ownsMessage(fields.Owner(), m.LSN)
		if oerr != nil {
			return oerr
		}
		if !owned {
			return nil
		}
		if sh := p.shard; sh.Count > 1 {
			// Every shard's slot receives every message: deliver only
			// this shard's, hashed on its table's key column as that
			// table's row filter hashes its rows.
			key, keyed := fields.Text(o.cfg.Router.KeyColumn)
			if shard.MessageOwner(key, keyed, sh.Count) != sh.Index {
				return nil
			}
		}
		o.messages.Inc()
		var rec *router.Record
		if err == nil {
			rec, err = o.router.RouteFields(m, fields, p.commitTime)
		}
		return p.deliver(o, rec, err, m.LSN, func() string { return "message " + m.Prefix })
	case *wal.Commit:
		if w := p.window; w.Upto != 0 && !w.Delivers(m.EndLSN) {
			p.log.Warn("an old shard delivered a transaction that ends after the reshard's cutover; the new shards deliver it again",
				"end_lsn", m.EndLSN.String(), "cutover", w.Upto.String(), "slot", p.cfg.Postgres.Slot)
		}
		txn := p.txn
		txn.Commit(m.EndLSN)
		p.txn, p.done, p.before = nil, nil, false
		p.m.transactions.Inc()
		if p.eos != nil {
			return p.eos.Committed(p.ctx, txn, m.EndLSN)
		}
	case wal.Keepalive:
		p.tracker.Idle(m.WALEnd)
		if w := p.window; w.Upto != 0 && p.tracker.Confirmed() >= w.Upto {
			p.endWindow() // idle up to the cutover: nothing more to deliver
		}
	default:
		// A new item type must be handled here: dropping a keepalive would
		// pin WAL, dropping a commit would stop confirmations.
		return fmt.Errorf("pipeline: unhandled stream item %T", item)
	}
	return nil
}

// endWindow ends an old shard's delivery at its reshard window's end:
// nothing more is handled, and the stream stops at the next transaction
// boundary; the drain stage confirms the cutover once every record before
// it is acknowledged.
func (p *Pipeline) endWindow() {
	p.pastWindow = true
	if p.stopReading != nil {
		p.stopReading()
	}
}

// ownsMessage reports whether this deployment delivers a logical message
// that names owner ("" for none), from the message alone, so that a replay
// decides as the first reading did, and the outbox table whose router
// routes it: one that names one of this deployment's postgres.table or
// postgres.tables is that table's, one that names another table is that
// table's outboxd's, and one that names none is the deployment's with
// router.messages.unowned: deliver (one outbox table only: config.Config.Validate
// refuses it with several). A message it leaves is counted, and the first
// of each kind in a run logged.
func (p *Pipeline) ownsMessage(owner string, lsn wal.LSN) (*table, bool, error) {
	for i := range p.outboxes {
		if owner == p.outboxes[i].cfg.Postgres.Table {
			return &p.outboxes[i], true, nil
		}
	}
	// A table a pattern matches that this run has not met yet.
	if i, ok, err := p.tables.Owner(p.ctx, owner); err != nil || ok {
		if err != nil {
			return nil, false, err
		}
		return &p.outboxes[i], true, nil
	}
	table := "not this outboxd's postgres.table " + p.outboxes[0].cfg.Postgres.Table
	if len(p.outboxes) > 1 {
		table = "none of this outboxd's postgres.tables " + p.tableNames()
	}
	switch {
	case owner != "":
		p.others.Inc()
		if !p.warnedOther {
			p.warnedOther = true
			p.log.Warn("a logical message names outbox table "+owner+", "+table+", so this outboxd leaves it to the outboxd of "+owner+
				" (counted in outboxd_wal_changes_total{op=\"message_other_outbox\"}). If no outboxd has postgres.table "+owner+", no one delivers it: "+
				"the writer's outbox Config.Table (the message's field "+router.OwnerField+") must equal the postgres.table of the outboxd that delivers it",
				"owner", owner, "lsn", lsn.String(), "slot", p.cfg.Postgres.Slot)
		}
		return nil, false, nil
	case p.takesUnowned && len(p.outboxes) == 1:
		return &p.outboxes[0], true, nil
	}
	p.unowned.Inc()
	if !p.warnedLeft {
		p.warnedLeft = true
		p.log.Info("a logical message names no outbox table (no field "+router.OwnerField+") and router.messages.unowned is ignore, so this outboxd leaves it "+
			"to the one outboxd on the database with router.messages.unowned: deliver (counted in outboxd_wal_changes_total{op=\"message_unowned\"})",
			"lsn", lsn.String(), "slot", p.cfg.Postgres.Slot)
	}
	return nil, false, nil
}

// tableNames are the outbox tables' names, comma-separated.
func (p *Pipeline) tableNames() string {
	names := make([]string, len(p.outboxes))
	for i := range p.outboxes {
		names[i] = p.outboxes[i].cfg.Postgres.Table
	}
	return strings.Join(names, ",")
}

// ErrUpdate marks an UPDATE refused by router.on_update: error; it is
// permanent.
var ErrUpdate error = &kindError{text: "update on the outbox table", permanent: true}

// deliver produces a routed record of outbox table o, or applies the poison
// policy to a row that could not be routed (routeErr) or produced. source
// names where the row came from, for errors only.
func (p *Pipeline) deliver(o *table, rec *router.Record, routeErr error, lsn wal.LSN, source func() string) error {
	if p.eos != nil {
		if skip, err := p.eos.Row(p.ctx, rec); skip || err != nil {
			return err
		}
	}
	routed := routeErr == nil
	if routed {
		if routeErr = Produce(p.ctx, p.txn, rec, p.producer, p.done); routeErr == nil {
			return nil
		}
	}
	var poison *router.RowError
	if !errors.As(routeErr, &poison) {
		return routeErr
	}
	if poison.LSN == 0 {
		poison.LSN, poison.Table = lsn, source()
	}
	if routed && poison.Headers == nil {
		// Refused by the producer: the routed record's headers, copied, as
		// rec and the buffers behind it are reused for the next row.
		poison.Headers = make([]router.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			poison.Headers[i] = router.Header{Key: h.Key, Value: bytes.Clone(h.Value)}
		}
		poison.Key, poison.Value = bytes.Clone(poison.Key), bytes.Clone(poison.Value)
	}
	// The poison policy and dead-letter topic of the row's own table: they
	// may differ per table (postgres.tables[].router.poison).
	if policy := o.cfg.Router.Poison.Policy; policy != config.PoisonDLQ {
		decided, where := p.poisonSetting(o)
		return &hintError{err: fmt.Errorf("%w. outboxd stopped without confirming past it: router.poison.policy of table %s is %s, %s",
			poison, o.cfg.Postgres.Table, policy, decided), hint: "to move past it deliberately, set router.poison.policy: dlq (and router.poison.dlq_topic) " +
			where + " and restart: the row goes to the dead-letter topic and streaming continues"}
	}
	o.deadLettered.Inc()
	p.log.Warn("outbox row sent to the dead-letter topic", "event_id", poison.EventID, "lsn", lsn.String(), "topic", o.cfg.Router.Poison.DLQTopic,
		"table", o.cfg.Postgres.Table, "reason", poison.Reason)
	return Produce(p.ctx, p.txn, DeadLetter(o.cfg, poison), p.producer, p.done)
}

// poisonSetting says which setting decided the poison policy of o's table,
// and where to set it.
func (p *Pipeline) poisonSetting(o *table) (decided, where string) {
	switch entry, own := p.cfg.PoisonFrom(o.cfg.Postgres.TableName()); {
	case own:
		return "set by " + entry, "in " + entry
	case entry != "":
		return "set by the top-level router (" + entry + " sets none of its own)",
			"in " + entry + " for this table alone, or under the top-level router for every table that sets none"
	}
	return "set by the top-level router", "under the top-level router"
}
