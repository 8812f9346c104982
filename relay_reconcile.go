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
