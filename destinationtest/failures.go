package destinationtest

import (
	"fmt"
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

// permanentAlone publishes a refused message (refuse) among good ones of
// other aggregates, before and after it in the call: it alone fails, as
// permanent; the others are delivered.
func permanentAlone(t *testing.T, d Destination, refuse func(Target) func(outbox.Message) outbox.Message) {
	tg := open(t, d.Open)
	ctx := testCtx(t, time.Minute)
	var msgs []outbox.Message
	for i := 0; i < 8; i++ {
		msgs = append(msgs, message(fmt.Sprintf("g-%d", i), 1))
	}
	bad := refuse(tg)(message("bad-1", 1))
	msgs = append(msgs[:3], append([]outbox.Message{bad}, msgs[3:]...)...)
	errs := tg.Publisher.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("Publish returned %v, want the refused message to fail", errs)
	}
	var good []outbox.Message
	for i, err := range errs {
		if i == 3 {
			continue
		}
		good = append(good, msgs[i])
		if err != nil {
			t.Errorf("good message %d failed with the refused one: %v", i, err)
		}
	}
	if !outbox.IsPermanent(errs[3]) || outbox.IsUnavailable(errs[3]) {
		t.Errorf("refused message: %v, want an error marked outbox.Permanent only", errs[3])
	}
	// The destination still takes messages after the refusal.
	later := message("g-later", 1)
	publishAll(t, ctx, tg.Publisher, []outbox.Message{later})
	good = append(good, later)

	seen := map[uuid.UUID]bool{}
	for _, dv := range read(t, ctx, tg, len(good)) {
		seen[dv.Message.ID] = true
	}
	for _, m := range good {
		if !seen[m.ID] {
			t.Errorf("message %s (%s) succeeded but is not at the destination", m.ID, m.AggregateID)
		}
	}
	if seen[bad.ID] {
		t.Errorf("the refused message %s is at the destination", bad.ID)
	}
}

// routeRefused publishes a message for a route the destination does not
// have between good ones: it alone fails, marked with the route being
// unavailable, never as permanent (nothing is wrong with it: once the route
// exists it is accepted, so the relay must hold it, not quarantine it); the
// others are delivered.
func routeRefused(t *testing.T, d Destination) {
	tg := open(t, d.Open)
	ctx := testCtx(t, time.Minute)
	good1, good2 := message("r-1", 1), message("r-2", 1)
	lost := tg.Unroute(message("r-lost", 1))
	errs := tg.Publisher.Publish(ctx, []outbox.Message{good1, lost, good2})
	if len(errs) != 3 || errs[0] != nil || errs[2] != nil {
		t.Fatalf("Publish returned %v, want the unrouted message alone to fail", errs)
	}
	if route, ok := outbox.UnavailableRoute(errs[1]); !ok || route == "" || outbox.IsPermanent(errs[1]) {
		t.Errorf("unrouted message: %v, want an error marked outbox.RouteUnavailable (naming its route), never Permanent", errs[1])
	}
	seen := map[uuid.UUID]bool{}
	for _, dv := range read(t, ctx, tg, 2) {
		seen[dv.Message.ID] = true
	}
	if !seen[good1.ID] || !seen[good2.ID] || seen[lost.ID] {
		t.Errorf("at the destination: good %t %t, unrouted %t; want the good ones only", seen[good1.ID], seen[good2.ID], seen[lost.ID])
	}
}
