package destinationtest

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
)

// unavailable checks that a destination that cannot be reached fails each
// message as unavailable, never as permanent, and that Probe agrees.
func unavailable(t *testing.T, d Destination) {
	tg := open(t, d.Open)
	ctx := testCtx(t, time.Minute)
	p := tg.Unreachable(t)
	msgs := []outbox.Message{message("u-1", 1), message("u-2", 1), message("u-3", 4)}
	start := time.Now()
	errs := p.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("Publish to an unreachable destination returned %v, want one error per message", errs)
	}
	for i, err := range errs {
		if !outbox.IsUnavailable(err) || outbox.IsPermanent(err) {
			t.Errorf("message %d: %v, want an error marked outbox.Unavailable only", i, err)
		}
	}
	t.Logf("Publish to an unreachable destination failed after %s", time.Since(start).Round(time.Millisecond))
	if pr, ok := p.(outbox.Prober); ok {
		if err := pr.Probe(ctx); !outbox.IsUnavailable(err) {
			t.Errorf("Probe of an unreachable destination: %v, want an error marked outbox.Unavailable", err)
		}
	}
	if pr, ok := tg.Publisher.(outbox.Prober); ok {
		if err := pr.Probe(ctx); err != nil {
			t.Errorf("Probe of the reachable destination: %v", err)
		}
	}
}

// permanentAlone publishes a refused message between two good ones of other
// aggregates: it alone fails, as permanent; the others are delivered.
func permanentAlone(t *testing.T, d Destination) {
	tg := open(t, d.Open)
	ctx := testCtx(t, time.Minute)
	good1, good2 := message("g-1", 1), message("g-2", 1)
	bad := tg.Refuse(message("bad-1", 1))
	msgs := []outbox.Message{good1, bad, good2}
	errs := tg.Publisher.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("Publish returned %v, want the refused message to fail", errs)
	}
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("the good messages failed with the refused one: %v, %v", errs[0], errs[2])
	}
	if !outbox.IsPermanent(errs[1]) || outbox.IsUnavailable(errs[1]) {
		t.Errorf("refused message: %v, want an error marked outbox.Permanent only", errs[1])
	}
	// The destination still takes messages after the refusal.
	good3 := message("g-3", 1)
	publishAll(t, ctx, tg.Publisher, []outbox.Message{good3})

	seen := map[uuid.UUID]bool{}
	for _, dv := range read(t, ctx, tg, 3) {
		seen[dv.Message.ID] = true
	}
	for _, m := range []outbox.Message{good1, good2, good3} {
		if !seen[m.ID] {
			t.Errorf("message %s (%s) succeeded but is not at the destination", m.ID, m.AggregateID)
		}
	}
	if seen[bad.ID] {
		t.Errorf("the refused message %s is at the destination", bad.ID)
	}
}
