package outbox

// Ordered pipelining: a batch goes out in one call, each lane in sequence
// order, to a destination that refuses out-of-order appends itself.
// The argument: docs/design.md, "Ordered pipelining".

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgoutbox/outbox/internal/failpoint"
)

// publishPipelined publishes every lane of the batch in one Publish call,
// each lane's events in sequence order (see OrderedPipeliner). Per lane the
// events up to the first failure are published; the first failure is
// classified like a wave's; the events after it are left unattempted, so
// that settleOutcome releases them without spending their attempts.
func (r *Relay) publishPipelined(ctx context.Context, b batch) (outcome, error) {
	var o outcome
	if ctx.Err() != nil || time.Now().After(b.deadline) {
		return o, nil
	}
	msgs := make([]Message, 0, b.total)
	for _, lane := range b.lanes {
		for _, ev := range lane {
			msgs = append(msgs, ev.Message)
		}
	}
	if err := failpoint.Hit("relay/before-publish"); err != nil {
		return o, nil
	}
	spans := r.tracer.startAll(msgs)
	pubStart := time.Now()
	errs := r.cfg.Publisher.Publish(ctx, msgs)
	ackLatency, ackedAt := time.Since(pubStart), time.Now()
	endAll(spans, errs)
	if errs != nil && len(errs) != len(msgs) {
		return o, fmt.Errorf("publisher returned %d results for %d messages", len(errs), len(msgs))
	}
	cut := ctx.Err() != nil // shutdown timeout: failures are not the events' fault
	i := 0
	for _, lane := range b.lanes {
		failed := false
		for _, ev := range lane {
			var err error
			if errs != nil {
				err = errs[i]
			}
			i++
			switch {
			case failed:
				if err == nil {
					// The publisher broke its promise: k+1 is at the destination
					// after a failed k. Releasing it sends it again after k.
					r.log.Error("publisher declared ordered pipelining but accepted an event after its aggregate's failed one; releasing it",
						slog.String("event_id", ev.ID.String()), slog.String("aggregate_id", ev.AggregateID), slog.Int64("sequence", ev.Sequence))
				}
			case err == nil:
				r.observePublish(ev, nil, false, ackLatency, ackedAt)
				o.published = append(o.published, ev.ID)
			default:
				failed = true
				if !cut {
					f := r.classify(ev, err, &o.outage)
					r.observePublish(ev, err, f.quarantine, ackLatency, time.Time{})
					o.failures = append(o.failures, f)
				}
			}
		}
	}
	if err := failpoint.Hit("relay/after-ack-before-mark"); err != nil {
		return o, err
	}
	return o, nil
}
