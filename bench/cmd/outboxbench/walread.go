package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// cmdWalread reads a slot to an end LSN as fast as it can and throws the rows
// away, like pg_recvlogical -f /dev/null, reporting the rate and the
// walsender's CPU time. With -lowat it raises the socket's SO_RCVLOWAT, so
// that the kernel wakes the reader once per that many bytes instead of once
// per message; on loopback the sender pays for each wake-up. It measures how
// much of Postgres' decoding rate a reader's wake-ups cost (BENCHMARKS.md,
// "What limits each figure"). Linux only.
func cmdWalread(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("walread", flag.ExitOnError)
	dsn := fs.String("dsn", "", "Postgres DSN of the slot's database")
	slot := fs.String("slot", "", "pgoutput slot to read")
	pub := fs.String("publication", "bench", "publication")
	endS := fs.String("end", "", "stop at the first commit ending at or after this LSN")
	lowat := fs.Int("lowat", 0, "SO_RCVLOWAT while reading (0: leave the socket alone)")
	received := fs.String("received", "", "live mode: read until SIGTERM and append \"<event id> <unix ns>\" to this file for each row, stamped when its commit arrives (no -end)")
	_ = fs.Parse(args)
	if *received != "" {
		return walreadLive(ctx, *dsn, *slot, *pub, *received)
	}
	end, err := pglogrepl.ParseLSN(*endS)
	if err != nil {
		return fmt.Errorf("-end: %w", err)
	}
	r, err := readSlot(ctx, *dsn, *slot, *pub, end, *lowat)
	if err != nil {
		return err
	}
	fmt.Printf("walread lowat=%d: %d rows in %.2f s = %.0f rows/s; walsender CPU %.2f s = %.2f s per 100k",
		*lowat, r.rows, r.took.Seconds(), float64(r.rows)/r.took.Seconds(), r.walsenderCPU, r.walsenderCPU/float64(r.rows)*1e5)
	if *lowat > 0 {
		fmt.Printf("; %d reads, %d waits ran out", r.reads, r.fallbacks)
	}
	fmt.Println()
	return nil
}

// slotRead is what readSlot measured.
type slotRead struct {
	rows             int
	took             time.Duration // START_REPLICATION to the end LSN
	walsenderCPU     float64       // seconds, from the start of the stream to the end LSN
	reads, fallbacks int           // with SO_RCVLOWAT
}

// readSlot reads slot through publication pub up to end, throwing the rows
// away, with SO_RCVLOWAT lowat if it is not 0, and confirms end.
func readSlot(ctx context.Context, dsn, slot, pub string, end pglogrepl.LSN, lowat int) (slotRead, error) {
	var res slotRead
	cfg, err := replicationConfig(dsn)
	if err != nil {
		return res, err
	}
	lw := &lowatReader{mark: lowat}
	var d net.Dialer
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok && err == nil && lowat > 0 {
			if lw.raw, err = tc.SyscallConn(); err != nil {
				return nil, err
			}
			lw.TCPConn = tc
			return lw, nil
		}
		return c, err
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer conn.Close(context.Background())
	start := time.Now()
	if err := startReplication(ctx, conn, slot, pub); err != nil {
		return res, err
	}
	wpid, err := walsenderPID(ctx, dsn, slot)
	if err != nil {
		return res, err
	}
	cpu0, err := procCPU(wpid)
	if err != nil {
		return res, err
	}
	inTx := false
	for pos := pglogrepl.LSN(0); pos < end; {
		raw, err := conn.ReceiveMessage(ctx)
		if err != nil {
			return res, err
		}
		cd, ok := raw.(*pgproto3.CopyData)
		if !ok || len(cd.Data) < 2 {
			continue
		}
		if cd.Data[0] == pglogrepl.PrimaryKeepaliveMessageByteID {
			// Like pg_recvlogical -E: a keepalive at or past the end
			// outside a transaction ends the read.
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return res, err
			}
			if !inTx && ka.ServerWALEnd >= end {
				break
			}
			if ka.ReplyRequested {
				err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos})
				if err != nil {
					return res, err
				}
			}
			continue
		}
		if cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		x, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			return res, err
		}
		switch x.WALData[0] {
		case 'B':
			inTx = true
		case 'I':
			res.rows++
		case 'C':
			inTx = false
			m, err := pglogrepl.Parse(x.WALData)
			if err != nil {
				return res, err
			}
			pos = m.(*pglogrepl.CommitMessage).TransactionEndLSN
		}
	}
	res.took = time.Since(start)
	// Confirm what was read, as pg_recvlogical does, and end the stream so
	// that Postgres applies it.
	err = pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: end})
	if err != nil {
		return res, err
	}
	if _, err := pglogrepl.SendStandbyCopyDone(ctx, conn); err != nil {
		return res, err
	}
	cpu1, err := procCPU(wpid)
	if err != nil {
		return res, err
	}
	res.walsenderCPU = cpu1 - cpu0
	res.reads, res.fallbacks = lw.reads, lw.fallbacks
	return res, nil
}

// walreadLive is the Postgres half of the live floor: it reads the slot as
// outboxd would, without Kafka, and writes each event's id with the time its
// transaction's commit message arrived, so that outboxbench live can measure
// commit → receipt under the same writers. It confirms what it read once a
// second and answers keepalives at once, as outboxd does.
func walreadLive(ctx context.Context, dsn, slot, pub, path string) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	var mu sync.Mutex
	w := bufio.NewWriterSize(out, 1<<16)
	flushed := make(chan struct{})
	go func() { // a reader tails the file: flush every 20 ms
		defer close(flushed)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				mu.Lock()
				_ = w.Flush()
				mu.Unlock()
			}
		}
	}()
	defer func() {
		stop() // ends the flusher on an error return too
		<-flushed
		mu.Lock()
		_ = w.Flush()
		mu.Unlock()
	}()

	cfg, err := replicationConfig(dsn)
	if err != nil {
		return err
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if err := startReplication(ctx, conn, slot, pub); err != nil {
		return err
	}
	idCol := map[uint32]int{} // relation → index of its id column
	var ids []string
	var pos pglogrepl.LSN
	nextStatus := time.Now().Add(time.Second)
	for ctx.Err() == nil {
		if time.Now().After(nextStatus) {
			err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos})
			if err != nil {
				return err
			}
			nextStatus = time.Now().Add(time.Second)
		}
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		raw, err := conn.ReceiveMessage(rctx)
		cancel()
		if pgconn.Timeout(err) || ctx.Err() != nil {
			continue
		}
		if err != nil {
			return err
		}
		cd, ok := raw.(*pgproto3.CopyData)
		if !ok || len(cd.Data) < 2 {
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return err
			}
			if ka.ReplyRequested {
				nextStatus = time.Now()
			}
			continue
		case pglogrepl.XLogDataByteID:
		default:
			continue
		}
		x, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			return err
		}
		m, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			return err
		}
		switch m := m.(type) {
		case *pglogrepl.RelationMessage:
			for i, c := range m.Columns {
				if c.Name == "id" {
					idCol[m.RelationID] = i
				}
			}
		case *pglogrepl.InsertMessage:
			i, ok := idCol[m.RelationID]
			if !ok || m.Tuple == nil || i >= len(m.Tuple.Columns) {
				return fmt.Errorf("insert into relation %d without an id column", m.RelationID)
			}
			ids = append(ids, string(m.Tuple.Columns[i].Data))
		case *pglogrepl.CommitMessage:
			at := time.Now().UnixNano()
			mu.Lock()
			for _, id := range ids {
				fmt.Fprintf(w, "%s %d\n", id, at)
			}
			mu.Unlock()
			ids, pos = ids[:0], m.TransactionEndLSN
		}
	}
	return nil
}

// replicationConfig is dsn's connection settings for a logical replication
// connection.
func replicationConfig(dsn string) (*pgconn.Config, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	return cfg, nil
}

// startReplication streams slot with pgoutput and publication pub, as
// outboxd does.
func startReplication(ctx context.Context, conn *pgconn.PgConn, slot, pub string) error {
	return pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + pub + "'"}})
}

// lowatReader keeps SO_RCVLOWAT at mark and waits for it with select (at
// most a millisecond) before reading; when the wait runs out it lowers the
// mark to 1, so that a short tail is still read.
type lowatReader struct {
	*net.TCPConn
	raw              syscall.RawConn
	mark, credit     int
	set              bool
	reads, fallbacks int
}

func (l *lowatReader) Read(p []byte) (int, error) {
	if l.credit <= 0 {
		ready, err := l.wait()
		if err != nil {
			return 0, err
		}
		if ready {
			l.credit = l.mark
		} else {
			l.fallbacks++
			if err := l.setLowat(1); err != nil {
				return 0, err
			}
		}
	}
	n, err := l.TCPConn.Read(p)
	l.credit -= n
	l.reads++
	return n, err
}

func (l *lowatReader) setLowat(v int) error {
	var serr error
	if err := l.raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, v)
	}); err != nil {
		return err
	}
	l.set = v > 1
	return serr
}

func (l *lowatReader) wait() (bool, error) {
	if !l.set {
		if err := l.setLowat(l.mark); err != nil {
			return false, err
		}
	}
	ready := false
	err := l.raw.Control(func(fd uintptr) {
		// select honours SO_RCVLOWAT for TCP; 1 ms.
		var set syscall.FdSet
		set.Bits[fd/64] |= 1 << (fd % 64)
		tv := syscall.Timeval{Usec: 1000}
		n, err := syscall.Select(int(fd)+1, &set, nil, nil, &tv)
		ready = err == nil && n > 0
	})
	return ready, err
}

func walsenderPID(ctx context.Context, dsn, slot string) (int, error) {
	c, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer c.Close(context.Background())
	r := c.ExecParams(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
		[][]byte{[]byte(slot)}, nil, nil, nil).Read()
	if r.Err != nil {
		return 0, r.Err
	}
	if len(r.Rows) != 1 || r.Rows[0][0] == nil {
		return 0, errors.New("slot " + slot + " has no walsender")
	}
	return strconv.Atoi(string(r.Rows[0][0]))
}
