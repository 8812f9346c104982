package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
)

// TestDestinationReadBack checks, on every destination of the
// destinations group, that the read-back after our relay's drains finds
// every event in order, and reports an aggregate's event stored before its
// predecessor, or after a gap.
func TestDestinationReadBack(t *testing.T) {
	t.Parallel() // see TestQuickRun
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := options{sz: quickSizes(),
		databaseURL: envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		natsURL:     envOr("NATS_URL", "nats://127.0.0.1:4222"), amqpURL: envOr("AMQP_URL", "amqp://127.0.0.1:5672/")}
	e, err := newEnv(ctx, o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	msg := func(agg string, seq int64) outbox.Message {
		return outbox.Message{ID: uuid.Must(uuid.NewV7()), AggregateType: "order", AggregateID: agg, Sequence: seq,
			Type: "OrderUpdated", SchemaVersion: 1, ContentType: outbox.ContentTypeJSON, Payload: []byte(payload),
			OccurredAt: time.Now().UTC(), Attempt: 1}
	}
	for _, d := range destinations {
		for _, tc := range []struct {
			name    string
			batches [][]outbox.Message
			err     string
		}{
			{"in-order", [][]outbox.Message{{msg("a", 1), msg("b", 1)}, {msg("a", 2), msg("b", 2)}, {msg("a", 3)}}, ""},
			{"successor-first", [][]outbox.Message{{msg("a", 1)}, {msg("a", 3)}, {msg("a", 2)}}, "I5 violated: aggregate order/a: sequence 3"},
			{"gap", [][]outbox.Message{{msg("b", 1)}, {msg("b", 3)}}, "I5 violated: aggregate order/b: sequence 3"},
		} {
			t.Run(d.name+"/"+tc.name, func(t *testing.T) {
				s, cleanup, err := e.newSpace(ctx, "readback-"+d.name+"-"+tc.name)
				if err != nil {
					t.Fatal(err)
				}
				defer cleanup()
				tg, err := d.open(ctx, e, s)
				if err != nil {
					t.Fatal(err)
				}
				defer tg.close()
				n := 0
				for _, batch := range tc.batches {
					if errs := tg.pub.Publish(ctx, batch); errs != nil {
						t.Fatal(errs)
					}
					n += len(batch)
				}
				got, err := tg.check(ctx, n)
				switch {
				case tc.err == "" && err != nil:
					t.Fatal(err)
				case tc.err == "" && got != n:
					t.Fatalf("read %d distinct events, want %d", got, n)
				case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
			})
		}
	}
}
