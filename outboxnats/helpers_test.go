package outboxnats_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
)

// server is a NATS server a test runs against.
type server struct {
	name string
	// connect returns a JetStream context on a new connection to the server.
	connect func(t *testing.T) jetstream.JetStream
}

// servers runs f against the real NATS server and against an embedded one.
func servers(t *testing.T, f func(t *testing.T, js jetstream.JetStream)) {
	t.Run("real", func(t *testing.T) {
		f(t, natstest.JetStream(t, natstest.Conn(t)))
	})
	t.Run("embedded", func(t *testing.T) {
		e := natstest.Embedded(t)
		f(t, natstest.JetStream(t, natstest.Connect(t, e.ClientURL())))
	})
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var occurred = time.Date(2026, 3, 14, 15, 9, 26, 535897000, time.UTC)

// event returns a message of aggregate ("order", id) with sequence seq.
func event(id string, seq int64) outbox.Message {
	return outbox.Message{
		ID:            uuid.New(),
		AggregateType: "order",
		AggregateID:   id,
		Sequence:      seq,
		Type:          "OrderCreated",
		SchemaVersion: 1,
		ContentType:   outbox.ContentTypeJSON,
		Payload:       fmt.Appendf(nil, `{"order":%q,"seq":%d}`, id, seq),
		OccurredAt:    occurred.Add(time.Duration(seq) * time.Millisecond),
		Attempt:       1,
	}
}

func streamInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	s, err := js.Stream(testCtx(t), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := s.Info(testCtx(t))
	if err != nil {
		t.Fatalf("stream %s info: %v", name, err)
	}
	return info
}

// readAll reads the first n messages of the stream in order.
func readAll(t *testing.T, js jetstream.JetStream, stream string, n int) []jetstream.Msg {
	t.Helper()
	ctx := testCtx(t)
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatalf("ordered consumer on %s: %v", stream, err)
	}
	var out []jetstream.Msg
	for len(out) < n {
		batch, err := cons.Fetch(min(n-len(out), 1000), jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatalf("fetch from %s: %v", stream, err)
		}
		got := 0
		for m := range batch.Messages() {
			out = append(out, m)
			got++
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("fetch from %s: %v", stream, err)
		}
		if got == 0 {
			t.Fatalf("stream %s: read %d messages, want %d", stream, len(out), n)
		}
	}
	return out
}

// checkNil fails the test when Publish reported errors.
func checkNil(t *testing.T, errs []error) {
	t.Helper()
	if errs == nil {
		return
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Publish: message %d of %d: %v", i, len(errs), err)
		}
	}
	t.Fatalf("Publish returned %d nil errors instead of nil", len(errs))
}

// waitStatus waits for the status change ch announces.
func waitStatus(t *testing.T, ch <-chan nats.Status, want nats.Status) {
	t.Helper()
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case st := <-ch:
			if st == want {
				return
			}
		case <-timeout.C:
			t.Fatalf("connection never became %s", want)
		}
	}
}
