package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

// cmdShards reads several slots of one fill in parallel, each through its own
// publication (a row filter taking a share of the aggregate ids), with a
// bare reader per slot (walread's, woken per -lowat bytes), and times them
// from the start until every reader has reached the fill's end LSN: the
// decoding half of sharded slots (issue 28), without Kafka.
func cmdShards(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("shards", flag.ExitOnError)
	c.register(fs)
	slots := fs.String("slots", "", "comma-separated slots, read in parallel")
	pubs := fs.String("publications", "", "comma-separated publications, one per slot")
	share := fs.Float64("share", 1, "the share of the keys each slot's publication takes (for the result line)")
	endS := fs.String("end", "", "the fill's end LSN")
	n := fs.Int("n", 0, "events in the fill")
	size := fs.Int("size", 250, "payload bytes (for the result line)")
	lowat := fs.Int("lowat", 32768, "SO_RCVLOWAT of each reader (0: leave the socket alone)")
	_ = fs.Parse(args)
	ss, ps := strings.Split(*slots, ","), strings.Split(*pubs, ",")
	if *slots == "" || len(ss) != len(ps) {
		return fmt.Errorf("-slots and -publications need one publication per slot")
	}
	end, err := pglogrepl.ParseLSN(*endS)
	if err != nil {
		return fmt.Errorf("-end: %w", err)
	}
	res := newResult(c, "shards")
	reads := make([]slotRead, len(ss))
	errs := make([]error, len(ss))
	finished := make([]time.Duration, len(ss))
	var wg sync.WaitGroup
	start := time.Now()
	for i := range ss {
		wg.Go(func() {
			reads[i], errs[i] = readSlot(ctx, c.dsn, ss[i], ps[i], end, *lowat)
			finished[i] = time.Since(start)
		})
	}
	wg.Wait()
	took := time.Since(start)
	var rows int
	var per []string
	for i, r := range reads {
		if errs[i] != nil {
			return fmt.Errorf("reading slot %s: %w", ss[i], errs[i])
		}
		rows += r.rows
		res.CPUSeconds += r.walsenderCPU
		per = append(per, fmt.Sprintf("%d rows in %.2f s (walsender %.2f CPU-s)", r.rows, finished[i].Seconds(), r.walsenderCPU))
	}
	res.Events, res.PayloadBytes = *n, *size
	res.Slots, res.Share, res.Rows = len(ss), *share, rows
	res.TotalSec = took.Seconds()
	res.Throughput = float64(*n) / took.Seconds()
	res.CPUPer100k = res.CPUSeconds / float64(*n) * 1e5
	res.Note = fmt.Sprintf("walsender CPU per 100k events of the fill; per slot: %s", strings.Join(per, ", "))
	res.print()
	return nil
}
