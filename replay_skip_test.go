package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestReplayAfterCleanupKeepsTheSkipMarker is the regression test of issue 8,
// item 5: clean-up deleted a skipped event as soon as its successor was
// published, so a replay of the successor carried no SkippedFrom, and an
// inbox restored to before the skip waited for the skipped event forever.
// The skipped row now stays while its successor is in the table, and goes
// once the successor was cleaned up.
func TestReplayAfterCleanupKeepsTheSkipMarker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), time.Hour)
	admin := newAdmin(t, pool, schema)
	writeEvents(t, pool, w, 1, 3) // agg-0 #1..#3
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.Sequence == 1 {
			return outbox.Permanent(errors.New("refused"))
		}
		return nil
	}}
	_, stop := startRelay(t, pool, quietConfig(schema, pub))
	poison := eventID(t, pool, schema, "agg-0", 1)
	outboxtest.Eventually(t, 30*time.Second, "#1 quarantined", func() bool {
		e, err := admin.Event(ctx, poison)
		return err == nil && e.State() == "quarantined"
	})
	if _, err := admin.Skip(ctx, poison, "test", "refused by the broker"); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "#2 and #3 published", func() bool { return unpublished(t, pool, schema) == 0 })
	stop()

	// The skip is past the horizon, its successors are not.
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now() - interval '2 hours', skipped_at = now() - interval '2 hours'
		WHERE event_id = $1`, poison); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: time.Hour}); err != nil {
		t.Fatal(err)
	}
	var replayed []outbox.Message
	var mu sync.Mutex
	capture := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		mu.Lock()
		defer mu.Unlock()
		replayed = append(replayed, msgs...)
		return nil
	})
	if _, err := admin.Replay(ctx, capture, outbox.ReplayConfig{AggregateType: "order", AggregateID: "agg-0", By: "test"}); err != nil {
		t.Fatal(err)
	}
	if len(replayed) != 2 || replayed[0].Sequence != 2 || replayed[0].SkippedFrom != 1 || replayed[1].SkippedFrom != 0 {
		t.Fatalf("replayed %+v: want #2 with SkippedFrom 1, then #3", replayed)
	}

	// Once the successors are cleaned up, the skipped row goes too (on a
	// later batch than its successor).
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if n := countEvents(t, pool, schema); n != 0 {
		t.Fatalf("%d events left after the successors were cleaned up, want 0", n)
	}
}
