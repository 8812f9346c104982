package destinationtest

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
)

// message returns a plain JSON event of an order aggregate. Times are
// whole microseconds, as PostgreSQL's timestamptz keeps them.
func message(aggregateID string, seq int64) outbox.Message {
	return outbox.Message{
		ID:            uuid.Must(uuid.NewV7()),
		AggregateType: AggregateTypes[0],
		AggregateID:   aggregateID,
		Sequence:      seq,
		Type:          "OrderCreated",
		SchemaVersion: 1,
		ContentType:   outbox.ContentTypeJSON,
		Payload:       fmt.Appendf(nil, `{"order":%q,"seq":%d}`, aggregateID, seq),
		OccurredAt:    time.Now().UTC().Truncate(time.Microsecond),
		Attempt:       1,
	}
}

// differences lists how got differs from want, field by field ("" when it
// does not). Attempt is not carried; nil and empty payloads and header maps
// are the same.
func differences(got, want outbox.Message) string {
	var b bytes.Buffer
	diff := func(field string, g, w any) { fmt.Fprintf(&b, "\n  %s: got %#v, want %#v", field, g, w) }
	if got.ID != want.ID {
		diff("ID", got.ID.String(), want.ID.String())
	}
	if got.AggregateType != want.AggregateType {
		diff("AggregateType", got.AggregateType, want.AggregateType)
	}
	if got.AggregateID != want.AggregateID {
		diff("AggregateID", got.AggregateID, want.AggregateID)
	}
	if got.Sequence != want.Sequence {
		diff("Sequence", got.Sequence, want.Sequence)
	}
	if got.Type != want.Type {
		diff("Type", got.Type, want.Type)
	}
	if got.SchemaVersion != want.SchemaVersion {
		diff("SchemaVersion", got.SchemaVersion, want.SchemaVersion)
	}
	if got.ContentType != want.ContentType {
		diff("ContentType", got.ContentType, want.ContentType)
	}
	if !bytes.Equal(got.Payload, want.Payload) {
		diff("Payload", string(got.Payload), string(want.Payload))
	}
	if len(got.Headers)+len(want.Headers) > 0 && !maps.Equal(got.Headers, want.Headers) {
		diff("Headers", got.Headers, want.Headers)
	}
	if !got.OccurredAt.Equal(want.OccurredAt) {
		diff("OccurredAt", got.OccurredAt.Format(time.RFC3339Nano), want.OccurredAt.Format(time.RFC3339Nano))
	}
	if got.SkippedFrom != want.SkippedFrom {
		diff("SkippedFrom", got.SkippedFrom, want.SkippedFrom)
	}
	if got.ReplayID != want.ReplayID {
		diff("ReplayID", got.ReplayID.String(), want.ReplayID.String())
	}
	return b.String()
}

// publishAll publishes msgs in one call and fails the test unless every one
// succeeded.
func publishAll(t *testing.T, ctx context.Context, p outbox.Publisher, msgs []outbox.Message) {
	t.Helper()
	errs := p.Publish(ctx, msgs)
	if errs == nil {
		return
	}
	if len(errs) != len(msgs) {
		t.Fatalf("Publish returned %d errors for %d messages: %v", len(errs), len(msgs), errs)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("message %d (%s %s/%d): %v", i, msgs[i].ID, msgs[i].AggregateID, msgs[i].Sequence, err)
		}
	}
	t.FailNow()
}

// read reads at least n deliveries from tg.
func read(t *testing.T, ctx context.Context, tg Target, n int) []Delivery {
	t.Helper()
	ds, err := tg.Read(ctx, n)
	if err != nil {
		t.Fatalf("read back %d messages: %v", n, err)
	}
	if len(ds) < n {
		t.Fatalf("read back %d messages, want at least %d", len(ds), n)
	}
	return ds
}
