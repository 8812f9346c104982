package outbox

// Publishing: a batch goes out in waves, one event per lane per wave, and
// each failure is classified: the event's own (a retry or a quarantine), or
// the destination's (an outage, a route refused, a throttled request), which
// spends no attempt.
// The argument: docs/design.md, "Publishing and fencing" and "Outages,
// routes and readiness".

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/pgtext"
)

type failure struct {
	id     uuid.UUID
	prior  int  // the event's attempt_count before this attempt
	outage bool // failed as Unavailable (or RouteUnavailable): no attempt spent
	// route is the route the destination refuses (RouteUnavailable), "" if
	// none; throttled: failed as Unavailable with a RetryAfter (the
	// destination said when to come back, for this request).
	route      string
	throttled  bool
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
	r.settleBookkeeping(&o)
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

// settleOutcome records a batch's outcome, after settleBookkeeping: marks,
// failure records, and the release of every event that was not attempted
// or met an outage (and so is not among o.failures).
func (r *Relay) settleOutcome(ctx context.Context, b batch, o outcome) error {
	published, failures := o.published, o.failures
	var unsent []uuid.UUID
	// Whatever was not attempted, or met an outage, goes back to the table
	// untouched.
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
	settleCtx := context.WithoutCancel(ctx)
	if len(failures) == 0 && len(unsent) == 0 {
		if len(published) == 0 {
			return nil
		}
		return r.markPublished(settleCtx, b, published) // the common case
	}
	return r.settleAll(settleCtx, b, published, failures, unsent)
}

// settleBookkeeping decides, from a batch's outcome as a whole, what each
// failure that was not the event's own comes to, and updates the relay's
// outage state (docs/design.md, "Outages, routes and readiness"):
//
//   - a batch that published anything ends an outage: the destination is
//     there;
//   - a batch that published nothing, with an event failed as Unavailable,
//     is a look that found the destination unavailable: those events are
//     released untouched (dropped from o.failures, so settleOutcome releases
//     them), unless the destination asked for a pause (RetryAfter), which
//     delays that event;
//   - an event whose route the destination refuses is held (holdForRoute),
//     never blamed on the event;
//   - an event throttled with a RetryAfter waits that long, spending
//     nothing, whatever the rest of the batch did;
//   - an event that failed as Unavailable while others were published is
//     retried shortly, and counted against itself after LoneOutageLimit
//     such claims in a row (blameLoneOutages).
func (r *Relay) settleBookkeeping(o *outcome) {
	r.routes.look++
	published := len(o.published) > 0
	for _, id := range o.published {
		r.forgetLoneOutage(id)
	}
	outage, reason := false, ""
	var lone []*failure
	kept := o.failures[:0]
	for _, f := range o.failures {
		switch {
		case !f.outage: // the event's own failure, classified already
		case f.route != "":
			r.holdForRoute(&f)
		case !published:
			outage, reason = true, f.err
			if f.delay == 0 {
				continue // released untouched
			}
		case f.throttled:
			// Its RetryAfter, set by classify; never less than a short
			// delay (a Retry-After of 0 would be a hot loop).
			f.delay = max(f.delay, r.shortDelay(1))
		default:
			// kept reuses o.failures' array and never outgrows it, so the
			// pointer stays valid.
			kept = append(kept, f)
			lone = append(lone, &kept[len(kept)-1])
			continue
		}
		kept = append(kept, f)
	}
	o.failures = kept
	r.blameLoneOutages(lone)
	switch {
	case published:
		r.endOutage("a batch was published")
	case outage:
		r.noteOutage(reason)
	}
}

// classify turns a publish error into the event's failure. The failures
// that are the destination's (Unavailable, RouteUnavailable) get their
// delay in settleBookkeeping, which knows the rest of the batch.
func (r *Relay) classify(ev claimedEvent, err error, outage *bool) failure {
	r.failed.Add(1)
	f := failure{id: ev.ID, prior: ev.attempts, err: truncate(err.Error(), 2000)}
	retryAfter, asked := RetryDelay(err)
	switch route, isRoute := UnavailableRoute(err); {
	case isRoute:
		*outage, f.outage, f.route = true, true, route
	case IsUnavailable(err):
		// The destination is down or throttling: no attempt is spent.
		*outage, f.outage, f.throttled = true, true, asked
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
	if asked && !f.quarantine {
		// The destination asked for a pause: honour it, within reason.
		f.delay = max(f.delay, min(retryAfter, RetryAfterMax))
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

// truncate makes an error text storable as last_error: cut to n bytes on a
// character, NUL and bytes that are not UTF-8 replaced. A destination's
// text holds anything (a webhook's binary body quoted); one PostgreSQL's
// text refuses failed the settle of the whole batch, at every lease.
func truncate(s string, n int) string {
	return pgtext.Clean(s, n)
}
