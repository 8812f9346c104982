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

// blameLoneOutages is called with the failures of a batch in which some
// events were published and these failed as Unavailable (neither throttled
// nor refused for their route). It counts each, and retries it after a short
// delay, spending nothing, while its count is below the limit: the
// destination is there (the batch published), so this is no outage, and a
// blip that touched a few events heals within a look or two. At the limit
// the failure becomes an ordinary one: attempts spent, backoff, quarantine
// after MaxAttempts.
func (r *Relay) blameLoneOutages(fs []*failure) {
	if len(fs) == 0 {
		return
	}
	if r.lone == nil || len(r.lone) >= maxLoneOutages {
		r.lone = make(loneOutages)
	}
	for _, f := range fs {
		r.lone[f.id]++
		if n := r.lone[f.id]; n < r.cfg.LoneOutageLimit {
			f.delay = r.shortDelay(n)
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
}

// forgetLoneOutage drops the count of an event that was published.
func (r *Relay) forgetLoneOutage(id uuid.UUID) {
	if len(r.lone) > 0 {
		delete(r.lone, id)
	}
}
