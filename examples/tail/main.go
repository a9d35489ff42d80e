// Command tail prints the records of Kafka topics as they arrive: topic,
// partition, offset, key, headers and value. The demo uses it to show
// outboxd's output; it is also handy against a real cluster.
//
//	go run ./examples/tail -brokers 127.0.0.1:9092 -topics '.*-events$' -n 5
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated Kafka brokers")
	topics := flag.String("topics", ".*-events$", "regular expression of topics to read")
	n := flag.Int("n", 0, "exit after this many records (0: run until interrupted)")
	since := flag.Duration("since", 0, "skip records older than this (0: print everything)")
	timeout := flag.Duration("timeout", 0, "exit with an error if -n records have not arrived by then")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(*brokers, ",")...),
		kgo.ConsumeRegex(), kgo.ConsumeTopics(*topics),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Topics that match the pattern after the first metadata request
		// (outboxd creates a topic on its first event) are found at the
		// next refresh: every second, not franz-go's default 5 minutes.
		kgo.MetadataMinAge(500*time.Millisecond), kgo.MetadataMaxAge(time.Second),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tail:", err)
		os.Exit(1)
	}
	defer cl.Close()
	cutoff := time.Time{}
	if *since > 0 {
		cutoff = time.Now().Add(-*since)
	}
	printed := 0
	for *n == 0 || printed < *n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			if *n > 0 && printed < *n {
				fmt.Fprintf(os.Stderr, "tail: %d of %d records arrived before the timeout\n", printed, *n)
				os.Exit(1)
			}
			return
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Timestamp.Before(cutoff) || (*n > 0 && printed >= *n) {
				return
			}
			printed++
			var hs []string
			for _, h := range r.Headers {
				hs = append(hs, h.Key+"="+string(h.Value))
			}
			fmt.Printf("%s [partition %d, offset %d] key=%s headers={%s}\n    %s\n",
				r.Topic, r.Partition, r.Offset, r.Key, strings.Join(hs, ", "), r.Value)
		})
	}
}
