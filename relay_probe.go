package outbox

// Outage probes: a relay that saw the destination unavailable and now has
// nothing to publish asks the publisher (when it is a Prober) whether the
// destination is back, instead of staying "not ready" until its next publish.

import (
	"context"
	"log/slog"
	"time"
)

// probeTimeout bounds one Probe call.
const probeTimeout = 5 * time.Second

// probeOutage runs on the relay's loop when it is in an outage (r.outages >
// 0) and its last claim found nothing. A successful probe ends the outage;
// a failed one counts like an unavailable batch, so the relay's wait before
// the next look grows with the same backoff.
func (r *Relay) probeOutage(ctx context.Context) {
	if r.prober == nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	err := r.prober.Probe(pctx)
	cancel()
	switch {
	case ctx.Err() != nil:
	case err != nil:
		r.outages++
		r.log.Debug("destination probe failed", slog.Any("error", err))
	default:
		r.log.Info("destination reachable again", slog.Int("unavailable_batches", r.outages))
		r.outages = 0
	}
}
