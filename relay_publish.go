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

// publishAndSettle publishes a batch in waves (the i-th event of every lane
// in wave i, so an aggregate's events go out strictly one after the other),
// then records the outcome with fenced updates.
func (r *Relay) publishAndSettle(ctx context.Context, b batch) error {
	var published []uuid.UUID
	var failures []failure
	var unsent []uuid.UUID
	live := make([]int, len(b.lanes)) // lanes still going
	for i := range live {
		live[i] = i
	}
	outage := false
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
		pubStart := time.Now()
		errs := r.cfg.Publisher.Publish(ctx, msgs)
		ackLatency, ackedAt := time.Since(pubStart), time.Now()
		if errs != nil && len(errs) != len(msgs) {
			return fmt.Errorf("publisher returned %d results for %d messages", len(errs), len(msgs))
		}
		cut := ctx.Err() != nil // shutdown timeout: failures are not the events' fault
		next := live[:0]
		for j, lane := range live {
			ev := b.lanes[lane][wave]
			if errs == nil || errs[j] == nil {
				r.observePublish(ev, nil, false, ackLatency, ackedAt)
				published = append(published, ev.ID)
				if wave+1 < len(b.lanes[lane]) {
					next = append(next, lane)
				}
				continue
			}
			if !cut {
				f := r.classify(ev, errs[j], &outage)
				r.observePublish(ev, errs[j], f.quarantine, ackLatency, time.Time{})
				failures = append(failures, f)
			}
		}
		live = next
		if err := failpoint.Hit("relay/after-ack-before-mark"); err != nil {
			return err
		}
	}
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
	if outage && len(published) > 0 {
		outage = r.blameLoneOutages(failures)
	}
	for _, id := range published {
		r.forgetLoneOutage(id)
	}
	if outage {
		r.outages++
	} else if len(published) > 0 {
		r.outages = 0
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
