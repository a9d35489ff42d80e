package daemon

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/config"
)

// Start hands outboxd its configuration as a YAML file: what outboxd reads
// back must be what the test set.
func TestConfigRoundTrip(t *testing.T) {
	cfg := Config("postgres://u@localhost:5432/db?sslmode=disable", "slot_1", []string{"localhost:9092", "localhost:9093"})
	cfg.Postgres.Table = "app.events"
	cfg.Router.IDColumn, cfg.Router.PayloadColumn = "event_id", "body"
	cfg.Kafka.DeliveryTimeout = 90 * time.Second
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "outboxd.yaml")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := config.Load(file, nil)
	if err != nil {
		t.Fatalf("outboxd refuses the file Start writes: %v\n%s", err, data)
	}
	// Compared as YAML: an empty list reads back as nil.
	back, err := yaml.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if string(back) != string(data) {
		t.Errorf("read back:\n%s\nwant:\n%s", back, data)
	}
}

// The readiness watch finds its text however the log is split.
func TestWatchedLog(t *testing.T) {
	var out []byte
	l := &watchedLog{w: writerFunc(func(p []byte) { out = append(out, p...) }), want: []byte("msg=streaming"), seen: make(chan struct{})}
	for _, p := range []string{"level=INFO msg=start", "ing\nlevel=INFO msg=str", "eam", "ing slot=x\n"} {
		if _, err := l.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-l.seen:
	default:
		t.Error("msg=streaming split over three writes was not seen")
	}
	if string(out) != "level=INFO msg=starting\nlevel=INFO msg=streaming slot=x\n" {
		t.Errorf("passed on %q", out)
	}
}

type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }
