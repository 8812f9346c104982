package outbox

// Publishing: a batch goes out in waves, one event per lane per wave, and
// each failure is classified as an outage, a retry or a quarantine.
// The argument: docs/design.md, "Publishing and fencing".

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/pgoutbox/outbox/internal/failpoint"
)

type failure struct {
	id         uuid.UUID
	prior      int  // the event's attempt_count before this attempt
	outage     bool // failed as Unavailable: no attempt spent
	delay      time.Duration
	attempts   int // attempts to add
	err        string
	quarantine bool
}

// publishAndSettle publishes a batch, in waves (publishWaves) or, to a
// destination that declares ordered pipelining, in one call
// (publishPipelined), then records the outcome with fenced updates.
func (r *Relay) publishAndSettle(ctx context.Context, b batch) error {
	var o outcome
	var err error
	if r.pipelined {
		o, err = r.publishPipelined(ctx, b)
	} else {
		o, err = r.publishWaves(ctx, b)
	}
	if err != nil {
		return err
	}
	if err := r.settleOutcome(ctx, b, o); err != nil {
		return err
	}
	r.cursor.continueLanes(b, o.published)
	return nil
}

// outcome is what publishing a batch came to.
type outcome struct {
	published []uuid.UUID
	failures  []failure
	outage    bool // some event failed as Unavailable
}

// publishWaves publishes a batch in waves: the i-th event of every lane in
// wave i, so an aggregate's events go out strictly one after the other.
func (r *Relay) publishWaves(ctx context.Context, b batch) (outcome, error) {
	var o outcome
	live := make([]int, len(b.lanes)) // lanes still going
	for i := range live {
		live[i] = i
	}
	for wave := 0; len(live) > 0; wave++ {
		if ctx.Err() != nil || time.Now().After(b.deadline) {
			break
		}
		msgs := make([]Message, len(live))
		for j, lane := range live {
			msgs[j] = b.lanes[lane][wave].Message
		}
		if err := failpoint.Hit("relay/before-publish"); err != nil {
			break
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
		next := live[:0]
		for j, lane := range live {
			ev := b.lanes[lane][wave]
			if errs == nil || errs[j] == nil {
				r.observePublish(ev, nil, false, ackLatency, ackedAt)
				o.published = append(o.published, ev.ID)
				if wave+1 < len(b.lanes[lane]) {
					next = append(next, lane)
				}
				continue
			}
			if !cut {
				f := r.classify(ev, errs[j], &o.outage)
				r.observePublish(ev, errs[j], f.quarantine, ackLatency, time.Time{})
				o.failures = append(o.failures, f)
			}
		}
		live = next
		if err := failpoint.Hit("relay/after-ack-before-mark"); err != nil {
			return o, err
		}
	}
	return o, nil
}

// settleOutcome records a batch's outcome: marks, failure records, and the
// release of every event that was not attempted.
func (r *Relay) settleOutcome(ctx context.Context, b batch, o outcome) error {
	published, failures := o.published, o.failures
	var unsent []uuid.UUID
	// Whatever was not attempted goes back to the table untouched.
	for _, lane := range b.lanes {
		if len(published)+len(failures) == b.total {
			break // everything was attempted (the common case)
		}
		for _, ev := range lane {
			if !contains(published, ev.ID) && !containsFailure(failures, ev.ID) {
				unsent = append(unsent, ev.ID)
			}
		}
	}
	r.settleBookkeeping(o)
	settleCtx := context.WithoutCancel(ctx)
	if len(failures) == 0 && len(unsent) == 0 {
		if len(published) == 0 {
			return nil
		}
		return r.markPublished(settleCtx, b, published) // the common case
	}
	return r.settleAll(settleCtx, b, published, failures, unsent)
}

// settleBookkeeping updates the relay's outage counts from a batch's
// outcome: a batch met an outage unless only lone events did (see
// blameLoneOutages); a batch that published something ends the run of
// outages.
func (r *Relay) settleBookkeeping(o outcome) {
	outage := o.outage
	if outage && len(o.published) > 0 {
		outage = r.blameLoneOutages(o.failures)
	}
	for _, id := range o.published {
		r.forgetLoneOutage(id)
	}
	if outage {
		r.outages++
	} else if len(o.published) > 0 {
		r.outages = 0
	}
}

func (r *Relay) classify(ev claimedEvent, err error, outage *bool) failure {
	r.failed.Add(1)
	f := failure{id: ev.ID, prior: ev.attempts, err: truncate(err.Error(), 2000)}
	switch {
	case IsUnavailable(err):
		// The destination is down: no attempt is spent on this event.
		*outage, f.outage = true, true
		f.delay = backoff(r.outages+1, r.cfg.RetryBackoffMin, r.cfg.RetryBackoffMax)
	case IsPermanent(err):
		f.attempts, f.quarantine = 1, true
	default:
		f.attempts = 1
		if ev.attempts+1 >= r.cfg.MaxAttempts {
			f.quarantine = true
		} else {
			f.delay = backoff(ev.attempts+1, r.cfg.RetryBackoffMin, r.cfg.RetryBackoffMax)
		}
	}
	if d, ok := RetryDelay(err); ok && !f.quarantine {
		// The destination asked for a pause: honour it, within reason.
		f.delay = max(f.delay, min(d, RetryAfterMax))
	}
	if f.quarantine {
		r.quarantined.Add(1)
		r.log.Error("event quarantined", slog.String("event_id", ev.ID.String()), slog.String("aggregate_type", ev.AggregateType),
			slog.String("aggregate_id", ev.AggregateID), slog.Int64("sequence", ev.Sequence), slog.Any("error", err))
	}
	return f
}

func contains(ids []uuid.UUID, id uuid.UUID) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func containsFailure(fs []failure, id uuid.UUID) bool {
	for _, f := range fs {
		if f.id == id {
			return true
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
