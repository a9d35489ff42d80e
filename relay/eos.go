package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/checkpoint"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// This file is kafka.delivery: exactly_once (DESIGN.md, "Exactly-once
// mode"). The pipeline goroutine owns one Kafka transaction at a time. It
// holds whole Postgres transactions in commit order and is committed at a
// Postgres transaction boundary (after a Commit, and before a Begin) when
// no complete Postgres transaction is waiting behind it, or once it is kafka.transaction_interval old or holds
// max_buffered_records records (commitDue), with the position (the end LSN of the
// last Postgres transaction it holds) written to kafka.positions_topic in
// the same transaction. Each Postgres transaction holds one extra record in
// the tracker (a hold) from its Begin until the Kafka transaction holding
// its last record commits, so the ack rule confirms the slot only to
// committed positions.

// producerFor returns the pipeline's producer: in exactly-once mode a
// transactional one, whose id needs the system identifier that conn (the
// run's replication connection, before START_REPLICATION) reports; the
// run's positions carry it too (Relay.system), so that reading them at the
// start needs no second replication connection. Nothing is fenced until
// Init. warm is what Check opened, for the first pipeline.
func (r *Relay) producerFor(ctx context.Context, conn *pgconn.PgConn, warm *Start) (*sink.Producer, error) {
	if !r.cfg.Kafka.ExactlyOnce() {
		return r.producer(warm)
	}
	if p := warm.takeProducer(); p != nil { // Check warmed a plain client
		p.Close()
	}
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("reading the system identifier for the exactly-once position: %w", err)
	}
	r.system = sys.SystemID
	id := r.transactionalID(sys.SystemID)
	r.txnID = id
	return sink.NewTransactional(r.cfg.Kafka, r.sinkM, r.txnM, r.log, id)
}

// transactionalID is the run's transactional id on the database with
// system identifier system.
func (r *Relay) transactionalID(system string) string {
	id := r.cfg.Kafka.TransactionalID
	if id == "" {
		return fmt.Sprintf("outboxd-%s-%s", system, r.cfg.Postgres.Slot) // a shard's slot: its own id
	}
	if r.shard.Count > 1 {
		// Shards must never share a transactional id: they would fence
		// each other.
		id = fmt.Sprintf("%s-%dof%d", id, r.shard.Index, r.shard.Count)
	}
	return id
}

// position is what exactly-once mode writes to kafka.positions_topic.
type position struct {
	// LSN is the end LSN of the last Postgres transaction whose rows are
	// all in Kafka; a restart skips every transaction ending at or before it.
	LSN wal.LSN
	// Txn, if not 0, is the commit LSN of a Postgres transaction split over
	// Kafka transactions, and Rows how many of its rows are in Kafka.
	Txn  wal.LSN
	Rows int
	// Timeline is the server's timeline when the position was written (0:
	// not known). After a promotion the new timeline may have begun before
	// LSN, and its transactions between the two would be skipped.
	Timeline int
	// Slot and System name the slot and the database (its IDENTIFY_SYSTEM
	// identifier; "" in positions written before it was recorded: not
	// known) whose stream the position is in. Its LSNs mean nothing in
	// another's.
	Slot, System string
}

type positionJSON struct {
	LSN      string `json:"lsn"`
	Txn      string `json:"txn,omitempty"`
	Rows     int    `json:"rows,omitempty"`
	Timeline int    `json:"timeline,omitempty"`
	Slot     string `json:"slot"`
	System   string `json:"system,omitempty"`
	At       string `json:"at"`
}

func (p position) encode() []byte {
	j := positionJSON{LSN: p.LSN.String(), Rows: p.Rows, Timeline: p.Timeline, Slot: p.Slot, System: p.System,
		At: time.Now().UTC().Format(time.RFC3339Nano)}
	if p.Txn != 0 {
		j.Txn = p.Txn.String()
	}
	b, _ := json.Marshal(j)
	return b
}

func decodePosition(b []byte) (position, error) {
	var j positionJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return position{}, err
	}
	p := position{Timeline: j.Timeline, Slot: j.Slot, System: j.System}
	var err error
	if p.LSN, err = pglogrepl.ParseLSN(j.LSN); err != nil {
		return position{}, err
	}
	if j.Txn != "" {
		if p.Txn, err = pglogrepl.ParseLSN(j.Txn); err != nil {
			return position{}, err
		}
		p.Rows = j.Rows
	}
	return p, nil
}

// eos is one pipeline run's exactly-once state, used by the pipeline
// goroutine only.
type eos struct {
	r        *Relay
	producer *sink.Producer
	tracker  *checkpoint.Tracker
	fail     context.CancelCauseFunc
	pos      position // read at the run's start
	system   string   // the server's system identifier, written with each position
	// last is the end LSN of the last Postgres transaction committed to the
	// tracker, or the start position.
	last wal.LSN
	// held are the Postgres transactions whose last record is in the open
	// Kafka transaction, in commit order.
	held           []*checkpoint.Txn
	records, bytes int // in the open Kafka transaction
	// The Postgres transaction being received.
	inTxn    bool
	final    wal.LSN // its commit LSN
	rows     int     // its rows handed over, in earlier Kafka transactions too
	skipRows int     // its rows a previous run put in Kafka
	skipping bool    // it ends at or before pos.LSN: skip it whole
}

// startEOS initialises the transactional producer (fencing the previous
// holder of the id, whose open transaction Kafka aborts), reads the last
// committed position and confirms it. Before it fences anyone it looks at
// the id's last position, committed or not: when another deployment's id
// it is, it refuses without disturbing that deployment; when it cannot
// read it, the run fails before Init and the next one tries again.
//
// The Kafka calls (each bounded by kafka.delivery_timeout) hold no
// replication connection of their own: the system identifier is the one
// producerFor read on the run's connection. Only then is a second one
// opened, for a moment, for the server's timeline (positionOnServer):
// walsenders are few (max_wal_senders), and shards and standbys need theirs.
func (r *Relay) startEOS(ctx context.Context, p *Pipeline, producer *sink.Producer) (*eos, error) {
	e := &eos{r: r, producer: producer, tracker: p.tracker, fail: p.fail, system: r.system}
	pos, found, err := e.readPosition(ctx)
	if err != nil {
		return nil, err
	}
	if e.pos, err = r.positionOnServer(ctx, pos, e.system, p.tables.db.Addr); err != nil {
		return nil, err
	}
	r.txnM.SetPositionRead(uint64(e.pos.LSN))
	e.tracker.Idle(e.pos.LSN) // nothing is registered yet: confirms it when it is past the slot
	e.last = e.tracker.Confirmed()
	r.log.Info("exactly-once: resuming after the position committed in Kafka", "transactional_id", e.producer.TransactionalID(),
		"lsn", e.pos.LSN.String(), "split_txn", e.pos.Txn.String(), "split_rows", e.pos.Rows, "found", found, "slot", r.cfg.Postgres.Slot)
	return e, nil
}

// readPosition is startEOS's Kafka part: fence, then the last committed
// position.
func (e *eos) readPosition(ctx context.Context) (pos position, found bool, err error) {
	if err := e.fence(ctx); err != nil {
		return position{}, false, err
	}
	return e.position(ctx, e.producer.ReadPosition)
}

// fence peeks at the id's last position and initialises the producer,
// fencing the id's previous holder (Kafka aborts or completes the
// transaction it left open). A peek that fails (the positions partition
// cannot be read) fails before Init: fencing the id's holder unseen could
// fence another deployment that shares the id. Only a peeked position that
// is not outboxd's (another writer's open transaction, say) leaves the
// decision to the committed one.
func (e *eos) fence(ctx context.Context) error {
	if e.system == "" {
		return errors.New("exactly-once: the system identifier was not read before the position (a bug)")
	}
	if err := e.producer.EnsurePositionsTopic(ctx); err != nil {
		return err
	}
	if _, _, err := e.position(ctx, e.producer.PeekPosition); err != nil {
		var foreign *foreignPositionError
		if !errors.As(err, &foreign) {
			return fmt.Errorf("looking at the last position of %q before initialising the transactional producer: %w",
				e.producer.TransactionalID(), err)
		}
	}
	return e.producer.Init(ctx)
}

// positionOnServer returns pos as it applies to the server now (onThisTimeline),
// on a replication connection opened for it and closed at once. The
// timeline and WAL end are read after Init: the previous holder committed
// positions until Init fenced it. system is the run's system identifier:
// a connection that reaches another database is refused. addr is the
// run's server (pg.Addr): another writable host of postgres.dsn, an old
// primary of the same database, would give an earlier timeline.
func (r *Relay) positionOnServer(ctx context.Context, pos position, system, addr string) (position, error) {
	if pos.LSN == 0 {
		return pos, nil // nothing to judge
	}
	repl, err := r.replicationAt(ctx, addr)
	if err != nil {
		return pos, err
	}
	defer repl.Close(context.WithoutCancel(ctx))
	sys, err := identify(ctx, repl)
	if err != nil {
		return pos, err
	}
	if sys.SystemID != system {
		return pos, fmt.Errorf("the connection for the exactly-once position reached the database with system identifier %s, and the run streams from %s: "+
			"postgres.dsn names servers of different databases; give it the hosts of one primary and its standbys", sys.SystemID, system)
	}
	return r.onThisTimeline(ctx, repl, int(sys.Timeline), sys.XLogPos, pos)
}

func identify(ctx context.Context, repl *pgconn.PgConn) (pglogrepl.IdentifySystemResult, error) {
	sys, err := pglogrepl.IdentifySystem(ctx, repl)
	if err != nil {
		return sys, fmt.Errorf("identifying the server for the exactly-once position: %w", err)
	}
	return sys, nil
}

// position reads the id's position with read (the producer's ReadPosition
// or PeekPosition). It refuses one that is not outboxd's, and one written
// for another slot or database (ownPosition); found is false when there is
// none.
func (e *eos) position(ctx context.Context, read func(context.Context) ([]byte, bool, error)) (pos position, found bool, err error) {
	v, ok, err := read(ctx)
	if err != nil || !ok || len(v) == 0 { // a tombstone (an operator's) is no position
		return position{}, false, err
	}
	id, topic := e.producer.TransactionalID(), e.r.cfg.Kafka.PositionsTopic
	if pos, err = decodePosition(v); err != nil {
		return position{}, false, &foreignPositionError{fmt.Errorf("the position of %q in %s is not outboxd's (%q): %w; delete it, or set another kafka.transactional_id",
			id, topic, v, err)}
	}
	return pos, true, ownPosition(pos, e.r.cfg.Postgres.Slot, e.system, id, topic)
}

// pipeEOS is pipe in exactly-once mode: besides the batches it wakes up to
// commit a Kafka transaction that is due while nothing arrives.
func (r *Relay) pipeEOS(ctx context.Context, batches <-chan []wal.Item, p *Pipeline, producer *sink.Producer) (err error) {
	e, err := r.startEOS(ctx, p, producer)
	if err != nil {
		return err
	}
	p.eos = e
	defer func() { err = e.end(ctx, err) }()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var wake <-chan time.Time
		if at, ok := e.due(); ok {
			timer.Reset(time.Until(at))
			wake = timer.C
		}
		select {
		case batch, ok := <-batches:
			if !ok {
				return e.finish(ctx)
			}
			last := lastCommit(batch)
			for i, item := range batch {
				if _, ok := item.(*wal.Begin); ok {
					// A boundary too: the one after the last Commit may
					// have counted this transaction as complete and waiting
					// when only its Begin and first rows were queued.
					if err := e.boundary(ctx, i < last || len(batches) > 0); err != nil {
						return err
					}
				}
				if err := p.Handle(item); err != nil {
					return err
				}
				if _, ok := item.(*wal.Commit); ok {
					// A complete transaction waits behind this one if a
					// later Commit is in the batch, or may if another
					// batch is queued.
					if err := e.boundary(ctx, i < last || len(batches) > 0); err != nil {
						return err
					}
				}
			}
			if err := e.boundary(ctx, len(batches) > 0); err != nil {
				return err
			}
		case <-wake:
			if err := e.tick(ctx); err != nil {
				return err
			}
		}
	}
}

// lastCommit returns the index of batch's last Commit, or -1.
func lastCommit(batch []wal.Item) int {
	for i := len(batch) - 1; i >= 0; i-- {
		if _, ok := batch[i].(*wal.Commit); ok {
			return i
		}
	}
	return -1
}

// skip handles an item of a transaction skipped whole.
func (e *eos) skip(item wal.Item) error {
	if _, ok := item.(*wal.Commit); ok {
		e.skipping = false
	}
	return nil
}

// begin starts a Postgres transaction. It reports whether to skip it whole
// (it ends at or before the position), and commits the open Kafka
// transaction first when the tracker's queue is full: only that commit
// makes room.
func (e *eos) begin(ctx context.Context, m *wal.Begin) (skip bool, err error) {
	if m.FinalLSN < e.pos.LSN {
		e.skipping = true
		return true, nil
	}
	e.inTxn, e.final, e.rows, e.skipRows = true, m.FinalLSN, 0, 0
	if e.pos.Txn != 0 && m.FinalLSN == e.pos.Txn {
		e.skipRows = e.pos.Rows
	}
	if e.tracker.Pending() >= e.r.cfg.Kafka.MaxBufferedRecords-1 {
		return false, e.commit(ctx)
	}
	return false, nil
}

// hold keeps x unconfirmed until the Kafka transaction holding its last
// record commits.
func (e *eos) hold(x *checkpoint.Txn) { x.Add() }

// row is called for each row before it is delivered. It reports whether
// to skip it (a previous run put it in Kafka), splits the Postgres
// transaction when the open Kafka transaction is too large or too old, and
// opens a Kafka transaction.
func (e *eos) row(ctx context.Context, rec *router.Record) (skip bool, err error) {
	e.rows++
	if e.skipRows > 0 {
		e.skipRows--
		return true, nil
	}
	k := e.r.cfg.Kafka
	if e.producer.InTransaction() && (e.bytes >= k.TransactionMaxBytes || time.Since(e.producer.Began()) >= e.maxAge()) {
		e.rows-- // this one goes in the next Kafka transaction
		err := e.commit(ctx)
		e.rows++
		if err != nil {
			return false, err
		}
	}
	if !e.producer.InTransaction() {
		if err := e.producer.Begin(); err != nil {
			return false, err
		}
	}
	e.records++
	if rec != nil {
		e.bytes += len(rec.Key) + len(rec.Value)
		for _, h := range rec.Headers {
			e.bytes += len(h.Key) + len(h.Value)
		}
	}
	return false, nil
}

// committed ends the Postgres transaction x (committed to the tracker);
// pipeEOS then asks boundary whether to commit the Kafka transaction.
func (e *eos) committed(_ context.Context, x *checkpoint.Txn, end wal.LSN) error {
	e.inTxn, e.skipRows = false, 0
	e.last = end
	e.held = append(e.held, x)
	if !e.producer.InTransaction() {
		e.release() // no record since the last commit: nothing to write
	}
	return nil
}

// boundary commits the open Kafka transaction at a Postgres transaction
// boundary when commitDue says so; waiting tells whether a complete
// Postgres transaction may be waiting behind it.
func (e *eos) boundary(ctx context.Context, waiting bool) error {
	if e.inTxn || !e.producer.InTransaction() {
		return nil
	}
	if !commitDue(e.records, time.Since(e.producer.Began()), waiting, e.r.cfg.Kafka) {
		return nil
	}
	return e.commit(ctx)
}

// commitDue decides whether a Kafka transaction of records records, open
// for age, commits at a Postgres transaction boundary. With no complete
// Postgres transaction waiting behind it, it commits at once: a quiet
// stream's events become visible a commit's round trip after they arrive,
// not kafka.transaction_interval later. Under load (transactions waiting)
// it keeps batching until it is kafka.transaction_interval old or holds
// kafka.max_buffered_records records, which holds the throughput: each
// commit then carries what arrived while the previous one was made, up to
// those limits.
func commitDue(records int, age time.Duration, waiting bool, k config.Kafka) bool {
	return !waiting || records >= k.MaxBufferedRecords || age >= k.TransactionInterval
}

// due returns when the pipeline must wake up to commit (or split) the open
// Kafka transaction if nothing arrives.
func (e *eos) due() (time.Time, bool) {
	if !e.producer.InTransaction() {
		return time.Time{}, false
	}
	if e.inTxn {
		return e.producer.Began().Add(e.maxAge()), true
	}
	return e.producer.Began().Add(e.r.cfg.Kafka.TransactionInterval), true
}

// maxAge is how long a Kafka transaction may stay open inside a Postgres
// transaction before it is split: half the transaction timeout, and half
// the delivery timeout, since the stall watchdog counts the wait of the
// Postgres transactions it completed.
func (e *eos) maxAge() time.Duration {
	return min(e.r.cfg.Kafka.TransactionTimeout, e.r.cfg.Kafka.DeliveryTimeout) / 2
}

// tick commits the open Kafka transaction when it is due.
func (e *eos) tick(ctx context.Context) error {
	at, ok := e.due()
	if !ok || time.Now().Before(at) {
		return nil
	}
	return e.commit(ctx)
}

// commit commits the open Kafka transaction with the position, then
// releases the holds of the Postgres transactions it completed. Inside a
// Postgres transaction (a split) the position says how many of its rows
// are in Kafka.
func (e *eos) commit(ctx context.Context) error {
	if !e.producer.InTransaction() {
		e.release()
		return nil
	}
	pos := position{LSN: e.last, Timeline: e.r.timeline, Slot: e.r.cfg.Postgres.Slot, System: e.system}
	if e.inTxn && e.rows > 0 {
		pos.Txn, pos.Rows = e.final, e.rows
	}
	if err := e.producer.Commit(ctx, pos.encode()); err != nil {
		return err
	}
	e.records, e.bytes = 0, 0
	e.release()
	return nil
}

// release lets the tracker confirm the held transactions.
func (e *eos) release() {
	for i, x := range e.held {
		x.Ack()
		e.held[i] = nil
	}
	e.held = e.held[:0]
}

// finish commits what the run completed when the stream has ended at a
// transaction boundary.
func (e *eos) finish(ctx context.Context) error {
	if ctx.Err() != nil || e.inTxn {
		return nil // end aborts
	}
	return e.commit(ctx)
}

// end aborts a Kafka transaction the run leaves open (Kafka would abort it
// only at its timeout, holding read_committed consumers back until then),
// and tells a run that ended because another instance took over.
func (e *eos) end(ctx context.Context, err error) error {
	if err == nil && ctx.Err() == nil && !e.producer.InTransaction() {
		return nil
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err = e.producer.AsFenced(err)
	var fenced *sink.FencedError
	if !errors.As(err, &fenced) {
		// The run may be ending for another reason first (the stream lost
		// the slot's connection): ask Kafka whether it was fenced.
		pctx, cancel := context.WithTimeout(actx, 2*time.Second)
		if f, ferr := e.producer.Fenced(pctx); ferr == nil && f {
			fenced = &sink.FencedError{TransactionalID: e.producer.TransactionalID(),
				Err: errors.New("the transaction coordinator holds a newer producer epoch")}
			err = fenced
		}
		cancel()
	}
	// Name the run's cause before aborting: the records the abort fails
	// must not become it.
	cause := err
	if cause == nil {
		cause = context.Cause(ctx) // the error that ended the run's errgroup
	}
	if cause != nil {
		e.fail(cause)
	}
	aerr := e.producer.Abort(actx)
	if fenced == nil && errors.As(aerr, &fenced) {
		return fenced // too late to be the run's cause, but the pipeline's error
	}
	if aerr != nil && err == nil && ctx.Err() == nil {
		return aerr
	}
	return err
}

// onThisTimeline returns pos as it applies to the server on repl, on
// timeline tli with its WAL at walEnd. A position written on an earlier
// timeline may lie past the point where the current one began (a promoted
// standby that had not received everything): the events between the two
// are in Kafka but not on this server, and the new timeline's transactions
// after the switch point must not be skipped as if they were those. Such a
// position is moved back to the switch point. A position from a later
// timeline than the server's (an old primary), or past the server's WAL (a
// database restored from a backup that kept its system identifier), is
// refused: applying it would skip what the server commits up to it.
func (r *Relay) onThisTimeline(ctx context.Context, repl *pgconn.PgConn, tli int, walEnd wal.LSN, pos position) (position, error) {
	if pos.LSN == 0 {
		return pos, nil
	}
	history, err := checkPosition(pos, tli, walEnd, r.cfg.Kafka.PositionsTopic)
	if err != nil || !history {
		return pos, err
	}
	end, ok, err := wal.TimelineEnd(ctx, repl, tli, pos.Timeline)
	if err != nil {
		return pos, err
	}
	if !ok {
		return pos, fmt.Errorf("the position in %s was written on timeline %d, which is not in the history of this server's timeline %d; "+
			"it belongs to another server: delete it from %[1]s, or set another kafka.transactional_id", r.cfg.Kafka.PositionsTopic, pos.Timeline, tli)
	}
	on, moved, dropped := rewind(pos, end, tli)
	if moved {
		r.log.Warn("exactly-once: the position in Kafka lies past where this server's timeline began; the events between them are in Kafka "+
			"but were lost in the promotion, and delivery resumes from the switch point", "position", pos.LSN.String(), "position_timeline", pos.Timeline,
			"switch_lsn", end.String(), "timeline", tli, "slot", r.cfg.Postgres.Slot)
	}
	if dropped {
		r.log.Warn("exactly-once: the position in Kafka names a transaction split over Kafka transactions that committed on the old timeline only, "+
			"at or after where this server's timeline began; its rows in Kafka are not on this server, and a transaction of this timeline "+
			"is delivered whole", "split_txn", pos.Txn.String(), "split_rows", pos.Rows, "switch_lsn", end.String(),
			"position_timeline", pos.Timeline, "timeline", tli, "slot", r.cfg.Postgres.Slot)
	}
	return on, nil
}

// rewind returns pos, written on an earlier timeline, as it applies to
// timeline tli, which branched off at end: moved back to end when it lies
// past it (moved). A split-transaction marker applies only to a transaction
// whose commit record begins before end, the WAL both timelines share: a
// commit at or after end was on the old timeline only, and a transaction of
// the new one that commits at that LSN is another, none of whose rows are
// in Kafka. dropped tells that pos carried such a marker, now gone.
func rewind(pos position, end wal.LSN, tli int) (on position, moved, dropped bool) {
	dropped = pos.Txn != 0 && pos.Txn >= end
	if pos.LSN > end {
		return position{LSN: end, Timeline: tli}, true, dropped
	}
	if dropped {
		pos.Txn, pos.Rows = 0, 0
	}
	return pos, false, dropped
}

// checkPosition judges a position against the server's timeline tli and WAL
// end: refused (an error), to be checked against the timeline's history
// (history), or fine as it is.
func checkPosition(pos position, tli int, walEnd wal.LSN, topic string) (history bool, err error) {
	switch {
	case pos.Timeline > tli:
		return false, fmt.Errorf("the position in %s was written on timeline %d, and this server is on timeline %d: it is an old primary; "+
			"point postgres.dsn at the current primary (target_session_attrs=read-write)", topic, pos.Timeline, tli)
	case pos.Timeline != 0 && pos.Timeline < tli:
		return true, nil
	case pos.LSN > walEnd:
		return false, fmt.Errorf("the position in %s (LSN %s) is past this server's WAL (%s): the database was restored from a backup, "+
			"or the position is another server's; outboxd would skip what the server commits up to it. "+
			"Set a new kafka.transactional_id (or delete the position's key from %[1]s) to start from the slot", topic, pos.LSN, walEnd)
	}
	return false, nil
}

// ownPosition refuses a position found under transactional id id that was
// written for another slot than slot, or another database than the one
// with system identifier system: two deployments given the same
// kafka.transactional_id. Its LSN says nothing about this slot's stream;
// applying it would skip this slot's transactions up to it and confirm the
// slot there. Each shard has its own slot and id (a reshard changes both),
// so a shard's position names its own slot.
func ownPosition(pos position, slot, system, id, topic string) error {
	var other string
	switch {
	case pos.Slot != slot:
		other = fmt.Sprintf("slot %q", pos.Slot)
		if pos.System != "" && pos.System != system {
			other += fmt.Sprintf(" of the database with system identifier %s", pos.System)
		}
	case pos.System != "" && pos.System != system:
		other = fmt.Sprintf("slot %q of the database with system identifier %s (this one's is %s)", pos.Slot, pos.System, system)
	default:
		return nil
	}
	return &refusedError{fmt.Errorf("the position of transactional id %q in %s (LSN %s) was written for %s, and this outboxd streams slot %q: "+
		"another deployment uses the same kafka.transactional_id, and applying its position would skip this slot's events. "+
		"Give each deployment its own kafka.transactional_id (or leave it empty: the default, outboxd-<system identifier>-<slot>, "+
		"differs per slot and database). If this deployment's slot or database was replaced, and the old one's events were all delivered, "+
		"write a tombstone for key %[1]q to %[2]s instead", id, topic, pos.LSN, other, slot)}
}

// refusedError is an error that a pipeline restart cannot fix: outboxd
// stops (IsPermanent) rather than try again, and, in exactly-once mode,
// fence the other holder of the transactional id again.
type refusedError struct{ err error }

func (e *refusedError) Error() string   { return e.err.Error() }
func (e *refusedError) Unwrap() error   { return e.err }
func (e *refusedError) Permanent() bool { return true }

// foreignPositionError reports a position record that is not outboxd's.
type foreignPositionError struct{ err error }

func (e *foreignPositionError) Error() string { return e.err.Error() }
func (e *foreignPositionError) Unwrap() error { return e.err }
