package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestFindsATopicCreatedAfterItStarts runs tail against kfake and creates
// the only matching topic after tail's first metadata request, as outboxd
// does when it creates a topic on the topic's first event (the demo). tail
// must find it at a metadata refresh and print its record well before its
// timeout.
func TestFindsATopicCreatedAfterItStarts(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bin := filepath.Join(t.TempDir(), "tail")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building tail: %v\n%s", err, out)
	}
	brokers := strings.Join(c.ListenAddrs(), ",")
	cmd := exec.Command(bin, "-brokers", brokers, "-topics", "^late-events$", "-n", "1", "-timeout", "20s")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // tail's first metadata request finds no such topic

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, "late-events"); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "late-events", Key: []byte("k"), Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("tail: %v (a topic that appears after it starts was not found); output:\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "late-events [partition 0, offset 0] key=k") {
		t.Fatalf("tail printed:\n%s", out.String())
	}
}
