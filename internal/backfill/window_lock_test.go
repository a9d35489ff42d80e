package backfill

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/internal/replay"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// ctx ends (SIGTERM) while the pipeline reads the next
// page and earlier pages are still in flight. pgx closes a connection whose
// query's ctx ends, so the backfill's session, and with it its advisory lock,
// goes away while records are in flight (a second outboxd may start sending
// the same rows), and the pages Kafka acknowledges during the drain are not
// saved.
func TestPipelineShutdownDuringReadKeepsTheLock(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	const batch = 100
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "order-events"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var answered atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		c.SleepControl(func() { time.Sleep(3 * time.Second) })
		answered.Add(1)
		return nil, nil, false
	})
	cfg, rel, r := pipelineSetup(t, c, batch, 30*time.Second)
	cfg.ShutdownTimeout = 10 * time.Second
	var rows []row
	for i := range batch {
		text := func(s string) wal.Datum { return wal.Datum{Kind: wal.DatumText, Data: []byte(s)} }
		rows = append(rows, row{key: []string{fmt.Sprintf("%06d", i)}, tuple: []wal.Datum{
			text(fmt.Sprintf("00000000-0000-0000-0000-%012d", i)), text("order"), text("k"), text("Created"), text(strconv.Itoa(i))}})
	}
	bg := context.Background()
	conn, err := pgx.Connect(bg, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(bg)
	other, err := pgx.Connect(bg, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(bg)
	const slot = "review_bfpipe"
	if _, err := lock(bg, conn, slot); err != nil {
		t.Fatal(err)
	}
	reading := make(chan struct{})
	reads := 0
	read := func(ctx context.Context, after []string) ([]row, error) {
		reads++
		if reads == 1 {
			return rows, nil
		}
		close(reading)
		res := conn.PgConn().ExecParams(ctx, "SELECT pg_sleep(1)", nil, nil, nil, nil)
		_, err := res.Close()
		return nil, err
	}
	var mu sync.Mutex
	var saves []State
	save := func(ctx context.Context, st State) error {
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		mu.Lock()
		saves = append(saves, st)
		mu.Unlock()
		return nil
	}
	reg := prometheus.NewRegistry()
	p, err := sink.New(cfg.Kafka, sink.NewMetrics(reg), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	b := &sender{cfg: cfg, log: slog.New(slog.DiscardHandler), conn: conn, state: State{Slot: slot, Total: batch * 2, Phase: phaseSending},
		src: replay.Source{Relation: rel, Router: r}, producer: p, m: NewMetrics(reg), progress: func(int64, int64) {}, read: read, save: save}
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() { done <- b.pipe(ctx, time.Now()) }()
	<-reading
	time.Sleep(200 * time.Millisecond)
	cancel() // SIGTERM while the next page is read, page 1 in flight
	time.Sleep(500 * time.Millisecond)
	var got bool
	if err := other.QueryRow(bg, `SELECT pg_try_advisory_lock(hashtext('outboxd.backfill:' || $1))`, slot).Scan(&got); err != nil {
		t.Fatal(err)
	}
	inFlight := answered.Load() == 0
	if got && inFlight {
		t.Errorf("another session took the backfill's lock while this run's records were still in flight (conn closed: %v)", conn.IsClosed())
	}
	err = <-done
	t.Logf("pipe returned %v; saves %d; conn closed %v", err, len(saves), conn.IsClosed())
	if len(saves) == 0 || saves[len(saves)-1].Sent != batch {
		t.Errorf("page 1, acknowledged during the drain, was not saved: a restart sends it again (saves %v)", saves)
	}
}
