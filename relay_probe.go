package outbox

// Outages: a batch in which nothing was published and some event failed as
// Unavailable puts the relay in an outage. An outage is the destination's
// state, not the events': they are released untouched, the relay stops
// claiming and looks at the destination again (a Probe when the publisher
// is a Prober) after a wait that wake-ups do not cut short, and the first
// look that finds it back lets the held events out at once.
// The argument: docs/design.md, "Outages, routes and readiness".

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// probeTimeout bounds one Probe call.
const probeTimeout = 5 * time.Second

// outageReadyAfter is how many consecutive looks must find the destination
// unavailable before Ready reports it: one failed batch (a broker blip, a
// connection reset that the next look finds healed) is not an outage worth
// reporting; the failed batch and the look after it are.
const outageReadyAfter = 2

// probeOutage runs on the relay's loop while it is in an outage (r.outages >
// 0), before it claims anything. With a Prober it asks the destination: a
// failure counts as one more look that found it unavailable, and the relay
// waits again; success lets it claim at once (the outage ends when that
// batch publishes something or finds nothing to publish). Without a Prober
// it reports true: the next batch is the look.
func (r *Relay) probeOutage(ctx context.Context) bool {
	if r.prober == nil {
		return true
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	err := r.prober.Probe(pctx)
	cancel()
	switch {
	case ctx.Err() != nil:
		return false
	case err != nil:
		r.noteOutage(err.Error())
		r.log.Debug("destination probe failed", slog.Any("error", err))
		return false
	}
	r.log.Info("destination reachable again: publishing what waited", slog.Int("unavailable_looks", r.outages))
	return true
}

// noteOutage counts one more look that found the destination unavailable.
func (r *Relay) noteOutage(reason string) {
	r.outages++
	r.outageErr = reason
	r.outageLooks.Add(1)
}

// endOutage ends an outage, if the relay is in one.
func (r *Relay) endOutage(why string) {
	if r.outages == 0 {
		return
	}
	r.log.Info("destination available again", slog.String("reason", why), slog.Int("unavailable_looks", r.outages))
	r.outages, r.outageErr = 0, ""
}

// outageWait is the wait before the next look at an unavailable destination:
// an exponential backoff from OutageProbeMax/8 to OutageProbeMax, with
// jitter, by the number of looks so far.
func (r *Relay) outageWait() time.Duration {
	return backoff(max(r.outages, 1), r.cfg.OutageProbeMax/8, r.cfg.OutageProbeMax)
}

// shortDelay is the delay of an event that failed as Unavailable while
// others of its batch were published, for the n-th time in a row: the same
// short steps as the looks at an unavailable destination.
func (r *Relay) shortDelay(n int) time.Duration {
	return backoff(max(n, 1), r.cfg.OutageProbeMax/8, r.cfg.OutageProbeMax)
}

// waitOutage waits before the next look at an unavailable destination. A
// wake-up does not cut it short: under a stream of commits every insert
// wakes the relay, and each wake-up used to claim and fail another batch
// within milliseconds, pushing those events' retries out by the backoff.
func (r *Relay) waitOutage(ctx context.Context) {
	d := r.outageWait()
	r.log.Warn("destination unavailable", slog.Int("consecutive", r.outages), slog.Duration("retry_in", d),
		slog.Any("error", errors.New(r.outageErr)))
	sleep(ctx, d)
}
