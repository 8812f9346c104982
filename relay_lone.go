package outbox

import (
	"fmt"
	"log/slog"

	"github.com/google/uuid"
)

// A destination is expected to tell "I cannot be reached" (Unavailable: the
// relay backs off as a whole and spends no attempt) from "I will not take
// this message" (a failure of that message). One that gets it wrong for a
// message (NATS closing the connection over one over-long subject was the
// case found) would hold that message, and its aggregate, forever without
// an attempt ever counted. The relay therefore watches for an event that
// fails as Unavailable in a batch where other events were published: after
// LoneOutageLimit such claims in a row, its error is treated as the event's
// own.

// loneOutages counts, per event, the consecutive batches in which the event
// failed as Unavailable while others were published. It is only touched by
// the relay's batch loop. Entries go when the event is published or blamed;
// the map is bounded, and emptied when full (the counts start again, which
// only delays a blame).
type loneOutages map[uuid.UUID]int

const maxLoneOutages = 10000

// blameLoneOutages is called for a batch in which some events were published
// and some failed as Unavailable. It counts each such failure and turns those
// that reached the limit into ordinary failures (attempts spent, backoff,
// quarantine after MaxAttempts). It reports whether an outage is still
// plausible: some Unavailable failure was not blamed on its event.
func (r *Relay) blameLoneOutages(fs []failure) (outage bool) {
	if r.lone == nil || len(r.lone) >= maxLoneOutages {
		r.lone = make(loneOutages)
	}
	for i := range fs {
		f := &fs[i]
		if !f.outage {
			continue
		}
		r.lone[f.id]++
		if r.lone[f.id] < r.cfg.LoneOutageLimit {
			outage = true
			continue
		}
		delete(r.lone, f.id)
		f.outage, f.attempts = false, 1
		f.err = truncate(fmt.Sprintf("unavailable on %d claims in a row while other events were published, so counted as this event's failure: %s",
			r.cfg.LoneOutageLimit, f.err), 2000)
		if f.prior+1 >= r.cfg.MaxAttempts {
			f.quarantine, f.delay = true, 0
			r.quarantined.Add(1)
		} else {
			f.delay = backoff(f.prior+1, r.cfg.RetryBackoffMin, r.cfg.RetryBackoffMax)
		}
		r.log.Warn("destination unavailable for one event only: counting it as the event's failure",
			slog.String("event_id", f.id.String()), slog.Int("attempt", f.prior+1), slog.Bool("quarantined", f.quarantine))
	}
	return outage
}

// forgetLoneOutage drops the count of an event that was published.
func (r *Relay) forgetLoneOutage(id uuid.UUID) {
	if len(r.lone) > 0 {
		delete(r.lone, id)
	}
}
