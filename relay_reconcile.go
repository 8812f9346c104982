package outbox

// Reconciling: a polling relay that leaves young events to a change-data-
// capture relay (RelayConfig.ReconcileAfter) and publishes only what has been
// pending longer than a threshold: the safety net beside `outbox relay
// --mode cdc`. The argument: docs/design.md, "Change-data capture".

import (
	"strconv"
	"time"
)

// reconcileHeadSQL is the extra condition on a lane head (alias e) claimed
// by a relay with ReconcileAfter set: the event was written at least
// threshold ago.
//
// It is occurred_at (the writer's transaction start), not available_at,
// that is compared. available_at moves forward when a publish fails (the
// backoff), and the CDC path never sees an event twice: an event it failed
// must be retried by the polling path as soon as its backoff ends, not a
// threshold later. claimable still requires available_at <= now(), so a
// backing-off event waits for its backoff either way. A writer transaction
// that stayed open longer than the threshold commits an event that is "old"
// at once; both paths may then race for it, which the claim's locks and
// leases settle (one of them claims it, the other finds it leased).
//
// Only heads are filtered: a head old enough takes its lane's contiguous
// successors, young or not, as the polling claim always does, and the CDC
// path finds those leased and leaves them.
func reconcileHeadSQL(e string, threshold time.Duration) string {
	return e + `.occurred_at <= now() - ` + strconv.FormatInt(threshold.Milliseconds(), 10) + ` * interval '1 millisecond'`
}

// A safety net's pace. Beside a healthy stream it finds nothing to claim,
// and every look still costs: the incremental claim reads the young events
// it leaves (a window of them while the stream is behind, each row checked
// for its head), and the full scan walks the pending index from its start,
// every entry vacuum could not remove included. Under a transaction held
// open for minutes (the pressure bench's pinned xmin), the two safety nets
// of a CDC group took a quarter of a core in young-window reads at one look
// a second, and their full scans up to 7 s each, on the database that the
// stream and the writers share (issue 27).
//
// What a safety net is for bounds how often it must look: an event the
// stream left becomes the net's only when it is ReconcileAfter old, so
// looking every ReconcileAfter/4 adds at most a quarter of that to the
// wait of such an event; and the full scan's own finds (leases of relays
// that died, rows written before migration 009) wait a lease anyway.
const (
	safetyNetLooksPerThreshold = 4 // looks per ReconcileAfter when idle
	safetyNetRescanThresholds  = 6 // ReconcileAfters between full scans, at least
)

// idleInterval is how long the relay waits for a wake-up or a poll when
// its last claim found nothing: PollInterval, or for a safety net at least
// ReconcileAfter/4.
func (r *Relay) idleInterval() time.Duration {
	if r.cfg.ReconcileAfter <= 0 {
		return r.cfg.PollInterval
	}
	return max(r.cfg.PollInterval, r.cfg.ReconcileAfter/safetyNetLooksPerThreshold)
}

// rescanInterval is the time between full scans: RescanInterval, or for a
// safety net at least 6 × ReconcileAfter. A negative RescanInterval (every
// claim a full scan) is kept.
func (r *Relay) rescanInterval() time.Duration {
	if r.cfg.ReconcileAfter <= 0 || r.cfg.RescanInterval < 0 {
		return r.cfg.RescanInterval
	}
	return max(r.cfg.RescanInterval, safetyNetRescanThresholds*r.cfg.ReconcileAfter)
}
