package outbox

import (
	"context"
	"time"
)

// Ack-before-mark is only as durable as the acknowledgement: the relay marks
// an event published once the destination acknowledged it, and never sends
// it again. If the destination acknowledged a message it then loses (kept in
// memory, written to one server's page cache and not yet fsynced), the event
// is gone while the outbox says it was published: invariant I3 is broken.
// docs/destinations.md, "What an acknowledgement is worth", has the settings
// that make each destination's acknowledgement durable.

// DurabilityChecker is implemented by a Publisher that can tell, without
// publishing, what its destination's acknowledgement is worth: whether an
// acknowledged message survives the loss of the server that acknowledged it
// (a power loss, a kernel crash), as far as the publisher can see from the
// destination's settings (a JetStream stream's storage and replicas, a
// Kafka topic's replication factor and min.insync.replicas, a RabbitMQ
// queue's type and durability).
//
// The relay calls CheckDurability once when it starts (see
// [Relay.AckDurability]) and warns, in its log, in `outbox status` and
// through a [DurabilityObserver], when the report says the acknowledgement
// is not durable. A setting the publisher cannot see counts as not
// durable, and the report says how to let it see it or what to change.
//
// CheckDurability returns an error only when it could not ask (the
// destination unreachable); the relay then tries again with backoff. It
// must honour ctx and be safe for concurrent use with Publish.
type DurabilityChecker interface {
	CheckDurability(ctx context.Context) (DurabilityReport, error)
}

// DurabilityReport is what a DurabilityChecker learnt about its
// destination's acknowledgement.
type DurabilityReport struct {
	// Destination names the kind of destination: "nats", "kafka", "amqp".
	Destination string `json:"destination"`
	// Durable reports that an acknowledged message survives the loss of the
	// server that acknowledged it: it was on disk (fsynced) before the
	// acknowledgement, or on at least two servers.
	Durable bool `json:"durable"`
	// Reason is a short snake_case code (the reason label of the
	// outbox_destination_ack_durable metric): when Durable, what the
	// durability rests on ("replicated", "sync_always", "quorum_queues");
	// otherwise what is wrong ("memory_storage", "replication_factor_1",
	// "queue_not_durable", ...).
	Reason string `json:"reason"`
	// Summary is one line for people: what was seen and, when not Durable,
	// the setting to change.
	Summary string `json:"summary"`
}

// AckDurability is what a relay learnt at start about its destination's
// acknowledgement: its publisher's DurabilityReport, or, when Checked is
// false, why there is none (the publisher is not a DurabilityChecker, or the
// check has not succeeded yet). A relay records it in its heartbeat row, so
// that `outbox status` shows it ([RelayInfo].AckDurability).
type AckDurability struct {
	// Checked reports that the publisher answered a check. When false,
	// Durable is false and Reason is "not_checked" (the publisher cannot
	// tell) or "check_pending" (it could not be asked yet).
	Checked bool `json:"checked"`
	DurabilityReport
	// CheckedAt is when the report was made.
	CheckedAt time.Time `json:"checked_at"`
}

// Reasons of an AckDurability that is not Checked.
const (
	// AckNotChecked: the publisher is not a DurabilityChecker (an HTTP
	// webhook: a 2xx is worth what the receiver promises).
	AckNotChecked = "not_checked"
	// AckCheckPending: the check failed (the destination could not be
	// asked); the relay tries again.
	AckCheckPending = "check_pending"
)

// DurabilityObserver is told what the relay learnt about its destination's
// acknowledgement: once when the check succeeds, or once at start when the
// publisher cannot be checked (Checked false). Set it as (part of)
// RelayConfig.Observer; outboxprom.Metrics implements it.
type DurabilityObserver interface {
	ObserveAckDurability(AckDurability)
}

// AckDurability returns what the relay learnt about its destination's
// acknowledgement when it started, and false while it has not looked yet
// (Run not called, or the check still failing: then the returned value
// says why).
func (r *Relay) AckDurability() (AckDurability, bool) {
	r.ack.mu.Lock()
	defer r.ack.mu.Unlock()
	if r.ack.last == nil {
		return AckDurability{}, false
	}
	return *r.ack.last, r.ack.last.Checked || r.ack.last.Reason == AckNotChecked
}
