package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestRetrySeenAndSkipSeenActOnTheQuarantineSeen: RetrySeen and SkipSeen
// act on the quarantine an operator saw and refuse, without an audit row,
// an event quarantined again since (ErrQuarantineChanged) or no longer
// quarantined (ErrNotQuarantined); the quarantine's filters (event type,
// error text ignoring case, a bound) and CountQuarantined select what they
// say.
func TestRetrySeenAndSkipSeenActOnTheQuarantineSeen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	admin := newAdmin(t, pool, schema)
	writeEvents(t, pool, w, 3, 1) // agg-0..agg-2 #1, types Step0
	// Quarantined by hand, a second apart, two with the same error.
	for i, agg := range []string{"agg-0", "agg-1", "agg-2"} {
		errText := []string{"422: Currency EUR refused", "timeout", "422: currency EUR refused"}[i]
		if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET quarantined_at = now() - make_interval(secs => 10 - $2), attempt_count = 3, last_error = $3
WHERE aggregate_id = $1`, agg, i, errText); err != nil {
			t.Fatal(err)
		}
	}
	match := outbox.QuarantineFilter{EventType: "Step0", ErrorContains: "CURRENCY eur"}
	seen, err := admin.ListQuarantined(ctx, match)
	if err != nil || len(seen) != 2 || seen[0].AggregateID != "agg-0" || seen[1].AggregateID != "agg-2" {
		t.Fatalf("quarantined Step0 with the currency error: %+v, %v; want agg-0 and agg-2", seen, err)
	}
	through := match
	first := seen[0].QuarantineCursor()
	through.Through = &first
	if n, err := admin.CountQuarantined(ctx, through, 100); err != nil || n != 1 {
		t.Fatalf("count through the first: %d, %v; want 1", n, err)
	}
	if n, err := admin.CountQuarantined(ctx, outbox.QuarantineFilter{EventType: "Step9"}, 100); err != nil || n != 0 {
		t.Fatalf("count of another type: %d, %v; want 0", n, err)
	}
	if n, err := admin.CountQuarantined(ctx, outbox.QuarantineFilter{}, 2); err != nil || n != 2 {
		t.Fatalf("count bounded by 2 of 3: %d, %v; want 2", n, err)
	}

	// agg-0 was retried and quarantined again since it was seen.
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET quarantined_at = now() WHERE event_id = $1`, seen[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RetrySeen(ctx, seen[0].QuarantineCursor(), "test"); !errors.Is(err, outbox.ErrQuarantineChanged) {
		t.Fatalf("RetrySeen of a quarantine since: %v, want ErrQuarantineChanged", err)
	}
	if _, err := admin.SkipSeen(ctx, seen[0].QuarantineCursor(), "test", "why"); !errors.Is(err, outbox.ErrQuarantineChanged) {
		t.Fatalf("SkipSeen of a quarantine since: %v, want ErrQuarantineChanged", err)
	}
	if ops, err := admin.Operations(ctx, outbox.OperationFilter{}); err != nil || len(ops) != 0 {
		t.Fatalf("refused actions wrote %+v, %v; want no audit row", ops, err)
	}
	if _, err := admin.SkipSeen(ctx, seen[1].QuarantineCursor(), "test", "refunded"); err != nil {
		t.Fatalf("SkipSeen of the quarantine seen: %v", err)
	}
	if _, err := admin.RetrySeen(ctx, seen[1].QuarantineCursor(), "test"); !errors.Is(err, outbox.ErrNotQuarantined) {
		t.Fatalf("RetrySeen of a skipped event: %v, want ErrNotQuarantined", err)
	}
	if ops, err := admin.Operations(ctx, outbox.OperationFilter{}); err != nil || len(ops) != 1 || ops[0].Action != "skip" || *ops[0].EventID != seen[1].ID {
		t.Fatalf("audit log %+v, %v; want the one skip", ops, err)
	}
}
