// Command anchor keeps one JetStream stream, OUTBOX_TEST_ANCHOR, on the NATS
// server the tests share (NATS_URL, or nats://127.0.0.1:4222), so that the
// server's store for the account never empties while they run. Every test
// creates a stream of its own and deletes it at its end; when a deletion left
// the account with no stream, nats-server 2.9 removed the account's store
// directory, and a stream created at that moment by another test failed with
// "could not create storage directory" (error 10077, reported to the client
// as 10049: "error creating store for stream"), which failed one chaos test
// in CI on 6 December 2026. .ci/run runs it before the tests. It is
// idempotent and leaves the stream in place.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "anchor:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := nats.Connect(outboxtest.NATSURL(), nats.Timeout(10*time.Second))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", outboxtest.NATSURL(), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: "OUTBOX_TEST_ANCHOR", Subjects: []string{"outbox_test_anchor"},
		Storage: jetstream.FileStorage, MaxMsgs: 1,
	})
	if err != nil {
		return fmt.Errorf("stream OUTBOX_TEST_ANCHOR: %w", err)
	}
	fmt.Println("anchor: stream OUTBOX_TEST_ANCHOR kept on", outboxtest.NATSURL())
	return nil
}
