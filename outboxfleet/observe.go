package outboxfleet

import (
	"sync/atomic"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxprom"
)

// sourceObserver is a source's relay observer: it records when the relay
// last claimed and last found an event (for the look), and passes every
// observation on to the source's metrics, when there are any.
type sourceObserver struct {
	metrics *outboxprom.Metrics
	claimAt atomic.Int64 // unix nanoseconds of the last claim
	foundAt atomic.Int64 // of the last claim that found an event
}

var (
	_ outbox.ClaimObserver       = (*sourceObserver)(nil)
	_ outbox.PublishObserver     = (*sourceObserver)(nil)
	_ outbox.SettleObserver      = (*sourceObserver)(nil)
	_ outbox.CleanupObserver     = (*sourceObserver)(nil)
	_ outbox.DestinationObserver = (*sourceObserver)(nil)
	_ outbox.DurabilityObserver  = (*sourceObserver)(nil)
)

func (o *sourceObserver) lastClaim() time.Time { return time.Unix(0, o.claimAt.Load()) }
func (o *sourceObserver) lastFound() time.Time { return time.Unix(0, o.foundAt.Load()) }

func (o *sourceObserver) ObserveClaim(c outbox.ClaimObservation) {
	if c.Err == nil {
		now := time.Now().UnixNano()
		o.claimAt.Store(now)
		if c.Events > 0 {
			o.foundAt.Store(now)
		}
	}
	if o.metrics != nil {
		o.metrics.ObserveClaim(c)
	}
}

func (o *sourceObserver) ObservePublish(p outbox.PublishObservation) {
	if o.metrics != nil {
		o.metrics.ObservePublish(p)
	}
}

func (o *sourceObserver) ObserveSettle(s outbox.SettleObservation) {
	if o.metrics != nil {
		o.metrics.ObserveSettle(s)
	}
}

func (o *sourceObserver) ObserveCleanup(c outbox.CleanupObservation) {
	if o.metrics != nil {
		o.metrics.ObserveCleanup(c)
	}
}

func (o *sourceObserver) ObserveDestination(d outbox.DestinationObservation) {
	if o.metrics != nil {
		o.metrics.ObserveDestination(d)
	}
}

func (o *sourceObserver) ObserveAckDurability(a outbox.AckDurability) {
	if o.metrics != nil {
		o.metrics.ObserveAckDurability(a)
	}
}
