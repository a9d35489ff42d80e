// Package daemon runs outboxd for tests as production runs it: the binary
// built from cmd/outboxd, started as a process with a configuration file.
// A test of a client library (outbox, consumer) can so check delivery end to
// end without compiling the daemon into its own binary.
//
// The caller's duties:
//
//  1. Have the test bed's services (package testenv) and the go command.
//  2. Write nothing the test expects delivered before Start returns: outboxd
//     delivers from the moment its slot exists, which is before it streams.
package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/testenv"
)

// Config returns outboxd's default configuration pointed at database dsn,
// slot and brokers, with fast status updates, three partitions per new
// topic, text logs and no HTTP server.
func Config(dsn, slot string, brokers []string) config.Config {
	cfg := config.Default()
	cfg.Postgres.DSN, cfg.Postgres.Slot = dsn, slot
	cfg.Postgres.StatusInterval = 200 * time.Millisecond
	cfg.Kafka.Brokers = brokers
	cfg.Kafka.TopicPartitions = 3
	cfg.HTTP.Listen = ""
	cfg.Log.Format = config.LogText
	return cfg
}

// Build builds outboxd from cmd/outboxd into dir and returns its path. The
// binary has the race detector when the calling test binary has it.
func Build(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "outboxd")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "github.com/outboxd/outboxd/cmd/outboxd")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building outboxd (go %s): %w\n%s", strings.Join(args, " "), err, out)
	}
	return bin, nil
}

// Start builds outboxd, runs it with cfg and waits until it streams. Its log
// goes to t.Log. At cleanup it is stopped with SIGTERM, and the test fails
// if it exited by itself or did not exit cleanly.
func Start(t testing.TB, cfg config.Config) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin, err := Build(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "outboxd.yaml")
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &watchedLog{w: testenv.LogWriter(t), want: []byte("msg=streaming"), seen: make(chan struct{})}
	cmd := exec.Command(bin, "-config", file)
	// Only what outboxd needs: no OUTBOXD_* setting of the test's own.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting outboxd: %v", err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	streamed := false
	t.Cleanup(func() {
		select {
		case <-exited:
			if streamed { // else the wait below said so
				t.Errorf("outboxd exited before the test ended: %v", waitErr)
			}
			return
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			if waitErr != nil {
				t.Errorf("outboxd: %v", waitErr)
			}
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("outboxd did not exit within a minute of SIGTERM")
		}
	})
	select {
	case <-logs.seen:
		streamed = true
	case <-exited:
		t.Fatalf("outboxd exited before it streamed: %v", waitErr)
	case <-time.After(time.Minute):
		t.Fatal("outboxd did not stream within a minute")
	}
}

// watchedLog passes outboxd's log on, and closes seen once want appeared
// in it.
type watchedLog struct {
	w    io.Writer
	want []byte

	mu   sync.Mutex
	tail []byte // the end of what was written, as long as want
	seen chan struct{}
	once sync.Once
}

func (l *watchedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	buf := append(append([]byte(nil), l.tail...), p...)
	if bytes.Contains(buf, l.want) {
		l.once.Do(func() { close(l.seen) })
	}
	l.tail = buf[max(0, len(buf)-len(l.want)):]
	l.mu.Unlock()
	return l.w.Write(p)
}
