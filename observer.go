package outbox

import (
	"errors"
	"time"
)

// The relay reports what it does to an observer, for metrics. An observer is
// any value set as RelayConfig.Observer that implements one or more of
// ClaimObserver, PublishObserver, SettleObserver, CleanupObserver,
// DestinationObserver and DurabilityObserver: the relay detects each
// interface once, by type assertion, and calls only those implemented. New
// observation kinds come as new interfaces, so existing observers keep
// compiling. Package outboxprom implements all of them for
// Prometheus; the root package itself depends on no metrics library.
//
// Observers are called synchronously from the relay's loop (and its
// clean-up goroutine), possibly from several goroutines at once: they must
// be safe for concurrent use, fast, and must not block.

// ClaimObserver is told about every claim round trip.
type ClaimObserver interface {
	ObserveClaim(ClaimObservation)
}

// ClaimObservation describes one claim.
type ClaimObservation struct {
	// Events is how many events were claimed.
	Events int
	// TakenOver is how many of them were claimed from another relay's
	// expired lease (the other relay died or stalled).
	TakenOver int
	// Duration is the claim statement's round trip.
	Duration time.Duration
	// FullScan is true for a full scan that ran in the background
	// (RelayConfig.RescanInterval): Duration is then the whole scan's,
	// which reads every pending event's index entries, dead ones too under
	// a transaction holding the xmin, and grows with them; an incremental
	// claim's does not. Reported for every such scan, also one that found
	// nothing.
	FullScan bool
	// More is true when the claim has more to read at once: its range
	// scan crossed a full window it could claim few or no events from
	// (leased, behind a head, locked), and events are committed past it.
	// The relay then claims again without waiting, so a claim with
	// Events 0 and More does not mean the relay is idle.
	More bool
	// Err is the claim's error (a database problem), nil on success.
	Err error
}

// PublishObserver is told about every event the relay tried to publish.
type PublishObserver interface {
	ObservePublish(PublishObservation)
}

// PublishObservation is the outcome of one event's publish attempt.
type PublishObservation struct {
	// AggregateType and EventType identify the kind of event.
	AggregateType string
	EventType     string
	// Attempt is 1 for the event's first attempt, then counts up.
	Attempt int
	// Err is the destination's error, nil when the event was acknowledged.
	Err error
	// Reason classifies Err; empty on success.
	Reason FailureReason
	// Quarantined reports that this failure quarantined the event.
	Quarantined bool
	// AckLatency is the duration of the Publisher.Publish call that carried
	// the event: how long the destination took to acknowledge (or fail) it.
	AckLatency time.Duration
	// CommitToAck is the time from the event's occurred_at (its
	// transaction's start, by the database clock) to the destination's
	// acknowledgement (by the relay's clock); zero on failure. It includes the
	// time the writer's transaction took and any difference between the
	// clocks.
	CommitToAck time.Duration
}

// FailureReason classifies a publish failure.
type FailureReason string

// The failure reasons.
const (
	// FailureRetryable: the destination refused or lost the message; the
	// event backs off and spends one of its attempts.
	FailureRetryable FailureReason = "retryable"
	// FailurePermanent: the destination will never accept the message (see
	// Permanent); the event is quarantined at once.
	FailurePermanent FailureReason = "permanent"
	// FailureUnavailable: the destination could not be reached (see
	// Unavailable); the event backs off without spending an attempt.
	FailureUnavailable FailureReason = "unavailable"
)

// Reason classifies a publish error the way the relay does.
func Reason(err error) FailureReason {
	switch {
	case err == nil:
		return ""
	case IsUnavailable(err):
		return FailureUnavailable
	case IsPermanent(err):
		return FailurePermanent
	}
	return FailureRetryable
}

// SettleObserver is told about every fenced write-back.
type SettleObserver interface {
	ObserveSettle(SettleObservation)
}

// SettleOp names a write-back.
type SettleOp string

// The write-backs.
const (
	// SettleMarkPublished marks acknowledged events published.
	SettleMarkPublished SettleOp = "mark_published"
	// SettleRecordFailures records failed attempts (backoff or quarantine).
	SettleRecordFailures SettleOp = "record_failures"
	// SettleRelease hands unattempted events back.
	SettleRelease SettleOp = "release"
)

// SettleObservation describes one write-back statement.
type SettleObservation struct {
	// Op is the write-back.
	Op SettleOp
	// Events is how many events it applied to.
	Events int
	// LeaseConflicts is how many it was refused for, because another relay
	// had taken them over after this relay's lease expired.
	LeaseConflicts int
	// Duration is the statement's round trip.
	Duration time.Duration
	// Err is the statement's error, nil on success.
	Err error
}

// CleanupObserver is told about every clean-up batch, by the relay's
// periodic clean-up and by Admin.Cleanup.
type CleanupObserver interface {
	ObserveCleanup(CleanupObservation)
}

// CleanupObservation describes one committed clean-up batch.
type CleanupObservation struct {
	// Table is "outbox_events" or "processed_events".
	Table string
	// Deleted is how many rows the batch deleted.
	Deleted int
	// Duration is the batch's transaction time.
	Duration time.Duration
}

// DestinationObserver is told, after every look at the destination (a
// batch, or a probe while it is unavailable), what the relay makes of it:
// the state Relay.Ready reports, as numbers for alerts.
type DestinationObserver interface {
	ObserveDestination(DestinationObservation)
}

// DestinationObservation is the relay's view of its destination.
type DestinationObservation struct {
	// Unavailable reports that the destination is unavailable as a whole
	// (two looks in a row found it so; see Relay.Ready). The events wait,
	// untouched, and no attempt is spent.
	Unavailable bool
	// RefusedRoutes is how many routes the destination refuses (see
	// RouteUnavailable) whose events the relay holds back, counting those
	// refused in two batches or more.
	RefusedRoutes int
}

// observers holds the interfaces an observer value implements.
type observers struct {
	claim       ClaimObserver
	publish     PublishObserver
	settle      SettleObserver
	cleanup     CleanupObserver
	destination DestinationObserver
	// durability: see DurabilityObserver (durability.go).
	durability DurabilityObserver
}

// detectObservers type-asserts o once. It refuses a value that implements
// none of the interfaces, which is always a mistake.
func detectObservers(o any) (observers, error) {
	var obs observers
	if o == nil {
		return obs, nil
	}
	obs.claim, _ = o.(ClaimObserver)
	obs.publish, _ = o.(PublishObserver)
	obs.settle, _ = o.(SettleObserver)
	obs.cleanup, _ = o.(CleanupObserver)
	obs.destination, _ = o.(DestinationObserver)
	obs.durability, _ = o.(DurabilityObserver)
	if obs.claim == nil && obs.publish == nil && obs.settle == nil && obs.cleanup == nil && obs.destination == nil && obs.durability == nil {
		return obs, errors.New("outbox: RelayConfig.Observer implements none of ClaimObserver, PublishObserver, SettleObserver, CleanupObserver, DestinationObserver, DurabilityObserver")
	}
	return obs, nil
}
