package wal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/internal/quote"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Keepalive carries the server's WAL end from a keepalive received outside any
// transaction. Handled in stream order, it lets an idle slot advance.
type Keepalive struct {
	WALEnd LSN
}

// StreamConfig says what to stream and how often to report.
type StreamConfig struct {
	Slot        string
	Publication string
	// StatusInterval is the keepalive period: a status update that asks
	// for a reply goes at least this often, whatever the position.
	StatusInterval time.Duration
	// ConfirmInterval is the shortest time between two status updates that
	// confirm a new position between keepalives: while a received
	// transaction is unconfirmed, the stream looks at the position this
	// often and sends it when it has advanced. 0 confirms only with
	// keepalives. What a crash repeats is what Kafka acknowledged in about
	// the last ConfirmInterval, plus what was in flight.
	ConfirmInterval time.Duration
	// ReceiveTimeout ends the stream with ErrSilentServer when nothing (no
	// data, no keepalive) has come from the server for this long while
	// outboxd was reading; 0 never does. A live walsender answers every
	// status update that asks for a reply, so silence longer than the
	// server's wal_sender_timeout means the connection is dead, or held open
	// by a middlebox that forwards nothing.
	ReceiveTimeout time.Duration
	// Messages asks pgoutput for logical decoding messages too.
	Messages bool
}

// ErrSilentServer: nothing came from the server for StreamConfig.ReceiveTimeout.
var ErrSilentServer error = &kind{text: "no message from the server"} // retried: a new connection may hear

// Stream is one replication session on one connection. See the package
// documentation for who may call what.
type Stream struct {
	conn     *pgconn.PgConn
	cfg      StreamConfig
	dec      *Decoder
	position func() LSN
	received LSN // end LSN of the last complete transaction received
	// OnStatus, if set, is called after each standby status update with the
	// positions sent. It runs on the stream's goroutine and must not block.
	OnStatus func(written, flushed LSN)
	// OnWarning, if set, is called with each WARNING notice from the server
	// other than the skipped-publication one, which ends the stream. It
	// runs on the stream's goroutine and must not block.
	OnWarning func(*pgconn.PgError)
	// OnRoundTrip, if set, is called with the time from a status update that
	// asked for a reply to the server's next keepalive.
	OnRoundTrip func(time.Duration)
	// SlotPosition, if set, reads the slot's confirmed position on another
	// connection. Close uses it when the server is slow to end the stream.
	SlotPosition func(context.Context) (LSN, error)
	pingSent     time.Time
	roundTrip    time.Duration // the last measured status → keepalive round trip
	sent         LSN           // the flush position of the last status update sent
	sched        schedule      // when status updates go
	slab         []byte        // the tail of the current slab (see keep)
	// For the receive timeout: received counts messages; heard is when a
	// read timeout last found the count changed, or when reading resumed
	// after a hand-over (time blocked there is not the server's silence).
	// Counting messages spares a clock read per message.
	msgs, heardMsgs uint64
	heard           time.Time
}

// StartStream issues START_REPLICATION on conn (a connection opened with
// replication=database) from position start, 0 meaning the slot's confirmed
// position. position reports what may be confirmed; it is called from the
// stream's goroutine.
func StartStream(ctx context.Context, conn *pgconn.PgConn, cfg StreamConfig, start LSN, position func() LSN) (*Stream, error) {
	args := []string{"proto_version '1'", "publication_names " + quote.Literal(quote.Ident(cfg.Publication))}
	if cfg.Messages {
		args = append(args, "messages 'true'")
	}
	err := pglogrepl.StartReplication(ctx, conn, cfg.Slot, start, pglogrepl.StartReplicationOptions{PluginArgs: args})
	if err != nil {
		return nil, fmt.Errorf("starting replication on slot %q: %w", cfg.Slot, err)
	}
	return &Stream{conn: conn, cfg: cfg, dec: NewDecoder(), position: position, received: start,
		sched: newSchedule(time.Now(), cfg.StatusInterval, cfg.ConfirmInterval)}, nil
}

// Batches handed on are cut at this many items or bytes of WAL data, or
// sooner when no more data is already buffered from the server.
const (
	maxBatchItems = 256
	clockEvery    = 64 // messages between clock reads while they arrive back to back
	maxBatchBytes = 1 << 20
)

// Run receives and decodes messages and sends them to out in batches, in
// order: *Begin, *Change, *Commit, *Message or Keepalive. It returns nil
// once graceful is done and no transaction is open, and an error when ctx is
// done or the stream fails. graceful must be derived from ctx.
//
// Reads wait on the connection's read deadline (the next status update),
// not on a context per message: ending ctx or graceful moves the deadline to
// now to wake a blocked read.
func (s *Stream) Run(ctx, graceful context.Context, out chan<- []Item) error {
	nc := s.conn.Conn()
	// One goroutine wakes the reads when graceful and then ctx end, and is
	// waited for: a wake-up left running after Run returns (as one of
	// context.AfterFunc can be) would cut Close's reads short.
	returned, woken := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(woken)
		for _, c := range []context.Context{graceful, ctx} {
			select {
			case <-c.Done():
				_ = nc.SetReadDeadline(time.Now())
			case <-returned:
				return
			}
		}
	}()
	defer func() {
		close(returned)
		<-woken
		_ = nc.SetReadDeadline(time.Time{})
	}()

	s.sched = newSchedule(time.Now(), s.cfg.StatusInterval, s.cfg.ConfirmInterval)
	s.heard = time.Now()
	var deadline time.Time
	var batch []Item
	batchBytes := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := s.send(ctx, out, batch)
		batch, batchBytes = nil, 0
		s.heard = time.Now()
		return err
	}
	for n := 0; ; n++ {
		// The clock is read when no byte of the next message is buffered,
		// after a hand-over or a receive timeout, and every clockEvery
		// messages in between (a small message takes microseconds), not
		// for every message.
		buffered := s.conn.Frontend().ReadBufferLen() > 0
		if !buffered || n%clockEvery == 0 {
			if err := s.tick(ctx, time.Now()); err != nil {
				return err
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !s.dec.InTransaction() && graceful.Err() != nil {
			return flush()
		}
		if len(batch) > 0 && (!buffered || len(batch) >= maxBatchItems || batchBytes >= maxBatchBytes) {
			if err := flush(); err != nil {
				return err
			}
			n = -1 // the hand-over may have taken long: clock and status first
			continue
		}
		if next := s.next(); !deadline.Equal(next) {
			deadline = next
			_ = nc.SetReadDeadline(deadline)
			// A wake that came just before was overwritten: look again,
			// rather than read until next.
			if ctx.Err() != nil || (!s.dec.InTransaction() && graceful.Err() != nil) {
				continue
			}
		}
		raw, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				if s.msgs != s.heardMsgs {
					s.heardMsgs, s.heard = s.msgs, time.Now()
				} else if t := s.cfg.ReceiveTimeout; t > 0 && time.Since(s.heard) > t {
					return Errorf(ErrSilentServer, "nothing came from the server on slot %q for %s (receive_timeout): "+
						"the connection is dead or held open by a middlebox; reconnecting", s.cfg.Slot, time.Since(s.heard).Round(time.Second))
				}
				deadline = time.Time{} // a wake may have moved it
				n = -1                 // a message may be part-read: the clock next
				continue
			}
			return fmt.Errorf("receiving from slot %q: %w", s.cfg.Slot, err)
		}
		s.msgs++
		item, err := s.handle(ctx, raw)
		if err != nil {
			return err
		}
		if item != nil {
			batch = append(batch, item)
			if cd, ok := raw.(*pgproto3.CopyData); ok {
				batchBytes += len(cd.Data)
			}
		}
	}
}

// send hands a batch on, reporting status while the consumer is busy so that
// Postgres holds the WAL instead of timing us out, and learns of the
// transactions Kafka acknowledges meanwhile.
func (s *Stream) send(ctx context.Context, out chan<- []Item, batch []Item) error {
	select {
	case out <- batch:
		return nil
	default:
	}
	for {
		timer := time.NewTimer(time.Until(s.next()))
		select {
		case out <- batch:
			timer.Stop()
			return nil
		case now := <-timer.C:
			if err := s.tick(ctx, now); err != nil {
				return err
			}
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
	}
}

// handle decodes one server message. It returns the item to hand on, if any.
func (s *Stream) handle(ctx context.Context, raw pgproto3.BackendMessage) (Item, error) {
	switch m := raw.(type) {
	case *pgproto3.CopyData:
		if len(m.Data) == 0 {
			return nil, errors.New("empty CopyData message from server")
		}
		switch m.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
			if err != nil {
				return nil, fmt.Errorf("parsing keepalive: %w", err)
			}
			if !s.pingSent.IsZero() {
				s.roundTrip = time.Since(s.pingSent)
				if s.OnRoundTrip != nil {
					s.OnRoundTrip(s.roundTrip)
				}
				s.pingSent = time.Time{}
			}
			if ka.ReplyRequested {
				if err := s.sendStatus(ctx, false); err != nil {
					return nil, err
				}
			}
			if s.dec.InTransaction() {
				return nil, nil
			}
			return Keepalive{WALEnd: ka.ServerWALEnd}, nil
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(m.Data[1:])
			if err != nil {
				return nil, fmt.Errorf("parsing XLogData: %w", err)
			}
			// The connection reuses its buffer: keep a copy of each message
			// whose decoded form refers to its bytes.
			data := xld.WALData
			if aliases(data) {
				data = s.keep(data)
			}
			msg, err := s.dec.Decode(xld.WALStart, data)
			if err != nil {
				return nil, err
			}
			switch m := msg.(type) {
			case *Begin:
				m.SentTime = xld.ServerTime
			case *Commit:
				if m.EndLSN > s.received {
					s.received = m.EndLSN
				}
			}
			return msg, nil
		}
		return nil, nil
	case *pgproto3.ErrorResponse:
		return nil, fmt.Errorf("slot %q: %w", s.cfg.Slot, pgconn.ErrorResponseToPgError(m))
	case *pgproto3.NoticeResponse:
		// Postgres 18's pgoutput no longer fails on a publication missing
		// at a point in the WAL: it warns ("skipped loading publication",
		// SQLSTATE 55000) and publishes nothing, so outboxd would confirm
		// past the events it skipped. Taken as the error earlier versions
		// raise.
		// Other warnings (Postgres 17's walsender warns with the same
		// SQLSTATE while a standby in synchronized_standby_slots is down)
		// go to OnWarning and the stream runs on.
		n := pgconn.ErrorResponseToPgError((*pgproto3.ErrorResponse)(m))
		if PublicationSkipped(n) {
			return nil, fmt.Errorf("slot %q: %w", s.cfg.Slot, n)
		}
		if s.OnWarning != nil && m.SeverityUnlocalized == "WARNING" {
			s.OnWarning(n)
		}
	case *pgproto3.CopyDone:
		return nil, fmt.Errorf("slot %q: server ended the replication stream", s.cfg.Slot)
	}
	return nil, nil
}

// slabSize is how many bytes of small messages one allocation holds.
const slabSize = 8 * smallMessage

// keep returns a copy of b that is never written again. Messages of up to
// smallMessage bytes are copied one after another into a shared slab: one
// allocation per twenty or so 250 B events instead of one each. A slab stays
// in memory while any message copied into it is referred to. So each record
// in flight to Kafka can hold up to slabSize bytes beyond its own: that
// worst case needs outbox rows to be a small share of the rows streamed (a
// publication shared with busier tables) and is 80 MiB at the default
// 10,000 records in flight. With a publication on the outbox table alone, a
// slab holds little but outbox rows, which are in flight anyway.
func (s *Stream) keep(b []byte) []byte {
	if len(b) > smallMessage {
		c := make([]byte, len(b))
		copy(c, b)
		return c
	}
	if cap(s.slab)-len(s.slab) < len(b) {
		s.slab = make([]byte, 0, slabSize)
	}
	n := len(s.slab)
	s.slab = append(s.slab, b...)
	// The full slice expression keeps an append by a holder of this copy
	// from writing over the next message.
	return s.slab[n:len(s.slab):len(s.slab)]
}

// Received returns the end LSN of the last complete transaction received.
func (s *Stream) Received() LSN { return s.received }

// next returns when the stream must next look at the clock to send a
// status update.
func (s *Stream) next() time.Time { return s.sched.next(s.received > s.sent) }

// tick sends the status update due at now, if any: the keepalive, which
// asks for a reply when none is awaited (the keepalive it brings measures
// the round trip and carries the server's WAL end for idle advancement), or
// the confirmed position, when it has advanced.
func (s *Stream) tick(ctx context.Context, now time.Time) error {
	var pos LSN
	step := s.sched.at(now, s.received > s.sent, func() bool {
		pos = s.position()
		return pos > s.sent
	})
	switch step {
	case keepalive:
		return s.sendStatus(ctx, s.pingSent.IsZero())
	case confirm:
		return s.sendPosition(ctx, pos, false)
	}
	return nil
}

// sendStatus sends a status update with the confirmed position.
func (s *Stream) sendStatus(ctx context.Context, reply bool) error {
	return s.sendPosition(ctx, s.position(), reply)
}

// sendPosition sends a status update that confirms flushed.
func (s *Stream) sendPosition(ctx context.Context, flushed LSN, reply bool) error {
	written := max(s.received, flushed)
	if flushed == 0 {
		// Nothing may be confirmed yet. pglogrepl sends the write position
		// as the flush position when the latter is 0: send 0 for both.
		written = 0
	}
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: written,
		WALFlushPosition: flushed,
		WALApplyPosition: flushed,
		ReplyRequested:   reply,
	})
	if err != nil {
		return fmt.Errorf("sending standby status at LSN %s: %w", flushed, err)
	}
	s.sent = flushed
	now := time.Now()
	s.sched.sent(now)
	if reply {
		s.pingSent = now
	}
	if s.OnStatus != nil {
		s.OnStatus(written, flushed)
	}
	return nil
}

// Close sends a final standby status update with the confirmed position,
// waits until the server has applied it (see endCopy), and closes the
// connection. Call it after Run has returned, with a short deadline in ctx.
func (s *Stream) Close(ctx context.Context) error {
	err := s.sendStatus(ctx, false)
	if err == nil {
		err = s.endCopy(ctx)
	}
	cerr := s.conn.Close(ctx)
	switch {
	case err == nil:
		return cerr
	case cerr != nil:
		// One line, unlike errors.Join's: both errors count (errors.Is).
		return fmt.Errorf("%w; closing the connection: %w", err, cerr)
	}
	return err
}

// endCopy ends the replication stream with CopyDone and waits until the
// server has applied the final status update. Closing at once instead lets a
// walsender that is still sending fail on the write and exit without reading
// the update: the next holder then starts behind what was delivered, and
// sends those transactions again.
//
// The server ends the stream at once when it is idle, and endCopy reads
// until it has, discarding data still on its way, as pg_recvlogical does.
// But a walsender sending one large transaction reads its client's messages
// only when its writes block, or every wal_sender_timeout/2; to a reader that
// keeps up it sends the whole transaction first. So when the end is slow to
// come and SlotPosition is set, endCopy stops reading: the connection fills,
// the walsender reads the update, and SlotPosition shows it applied.
func (s *Stream) endCopy(ctx context.Context) error {
	nc := s.conn.Conn()
	if d, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Now()) })
	defer func() {
		stop()
		_ = nc.SetDeadline(time.Time{})
	}()
	fe := s.conn.Frontend()
	fe.Send(&pgproto3.CopyDone{})
	if err := fe.Flush(); err != nil {
		return fmt.Errorf("ending the replication stream of slot %q: %w", s.cfg.Slot, err)
	}
	if s.SlotPosition != nil {
		// Long enough for the end to come back over a slow link.
		wait := max(endWait, 4*s.roundTrip)
		if d, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(d)/4)
		}
		_ = nc.SetReadDeadline(time.Now().Add(wait))
	}
	err := s.readToEnd()
	var ne net.Error
	if err != nil && s.SlotPosition != nil && ctx.Err() == nil && errors.As(err, &ne) && ne.Timeout() {
		return s.awaitApplied(ctx) // the end is slow to come
	}
	if err != nil {
		return fmt.Errorf("ending the replication stream of slot %q: %w", s.cfg.Slot, err)
	}
	return nil
}

// endWait is how long endCopy reads, at least, before it waits for the slot
// instead.
const endWait = 200 * time.Millisecond

// readToEnd reads until the server has ended the stream.
func (s *Stream) readToEnd() error {
	for {
		msg, err := s.conn.Frontend().Receive()
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.ReadyForQuery:
			return nil
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		}
	}
}

// awaitApplied polls SlotPosition until the slot's confirmed position has
// reached the last status update sent, or ctx is done.
func (s *Stream) awaitApplied(ctx context.Context) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		at, err := s.SlotPosition(ctx)
		if err == nil && at >= s.sent {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("slot %q: reading the slot to see the final status update (LSN %s) applied: %w", s.cfg.Slot, s.sent, err)
			}
			return fmt.Errorf("slot %q: Postgres had not applied the final status update (LSN %s; the slot is at %s): %w", s.cfg.Slot, s.sent, at, ctx.Err())
		case <-tick.C:
		}
	}
}

// SenderTimeout reads the server's wal_sender_timeout on a replication
// connection (0: the server never times a client out).
func SenderTimeout(ctx context.Context, conn *pgconn.PgConn) (time.Duration, error) {
	res, err := conn.Exec(ctx, "SHOW wal_sender_timeout").ReadAll()
	if err != nil {
		return 0, fmt.Errorf("reading wal_sender_timeout: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return 0, errors.New("reading wal_sender_timeout: unexpected reply to SHOW")
	}
	return ParseSetting(string(res[0].Rows[0][0]))
}

// ParseSetting parses a time setting as SHOW prints it: an integer with a
// unit of ms, s, min, h or d, or a bare integer of milliseconds.
func ParseSetting(v string) (time.Duration, error) {
	i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	digits, unit := v, ""
	if i >= 0 {
		digits, unit = v[:i], v[i:]
	}
	units := map[string]time.Duration{"": time.Millisecond, "ms": time.Millisecond, "s": time.Second,
		"min": time.Minute, "h": time.Hour, "d": 24 * time.Hour}
	u, ok := units[unit]
	n, err := strconv.ParseInt(digits, 10, 64)
	if !ok || err != nil || digits == "" {
		return 0, fmt.Errorf("reading a time setting: %q is not an integer with a unit of ms, s, min, h or d", v)
	}
	return time.Duration(n) * u, nil
}

// PublicationSkipped reports Postgres 18's warning that pgoutput skipped a
// publication missing at a point in the WAL, by its SQLSTATE (55000,
// object_not_in_prerequisite_state), its severity as the server sends it
// untranslated (a WARNING, not an ERROR) and the C function that raised it
// (LoadPublications in pgoutput.c), never by its text, which is in the
// server's language. The function name is needed: Postgres 17's walsender
// sends a WARNING of the same SQLSTATE from StandbySlotsHaveCaughtup
// whenever a standby named in synchronized_standby_slots is down, and taking
// that for a dropped publication would stop outboxd with wrong advice for as
// long as the standby is down.
func PublicationSkipped(e *pgconn.PgError) bool {
	return e.Code == "55000" && e.SeverityUnlocalized == "WARNING" && e.Routine == "LoadPublications"
}

// A step is what a schedule says to do.
type step int

const (
	wait      step = iota // nothing is due
	keepalive             // send a status update, asking for a reply
	confirm               // send a status update with the new position
)

// schedule decides when a stream sends standby status updates. It owns no
// clock and no connection: the stream passes the time and the position.
//
// A keepalive goes every interval, whatever the position: it keeps
// the walsender from timing the connection out, and the reply it asks for
// measures the round trip and lets an idle slot advance. Between
// keepalives, a new position goes as soon as the stream sees it, and the
// stream looks at most once per gap, only while a transaction it received
// is unconfirmed: at most one update per gap, none while nothing moves. So
// what Kafka acknowledged reaches Postgres about gap later at most, instead
// of an interval: that is what a crash repeats beyond what was in flight.
// Every status update sent (a keepalive, a confirmation, an answer to the
// server's request for one) starts a new gap.
type schedule struct {
	interval, gap time.Duration
	keepalive     time.Time // when the next keepalive is due
	look          time.Time // when the position may next be looked at
}

func newSchedule(now time.Time, interval, gap time.Duration) schedule {
	return schedule{interval: interval, gap: gap, keepalive: now.Add(interval), look: now}
}

// next returns when the stream must next call at. waiting says that a
// transaction it received is not yet confirmed.
func (c *schedule) next(waiting bool) time.Time {
	if waiting && c.gap > 0 && c.look.Before(c.keepalive) {
		return c.look
	}
	return c.keepalive
}

// at returns what to do at now. advanced reports whether the confirmed
// position is past the last one sent; at calls it only when a confirmation
// may be due, and when it is not, waits a gap before it looks again.
func (c *schedule) at(now time.Time, waiting bool, advanced func() bool) step {
	if !now.Before(c.keepalive) {
		c.keepalive = now.Add(c.interval)
		return keepalive
	}
	if !waiting || c.gap <= 0 || now.Before(c.look) {
		return wait
	}
	if advanced() {
		return confirm
	}
	c.look = now.Add(c.gap)
	return wait
}

// sent records that a status update went at now.
func (c *schedule) sent(now time.Time) { c.look = now.Add(c.gap) }
