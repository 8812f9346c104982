package outboxfleet

import (
	"sync"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxprom"
)

// sourceObserver is a source's relay observer: it records the relay's last
// claim (for the look: when it ended and whether it found events), and
// passes every observation on to the source's metrics, when there are any.
type sourceObserver struct {
	metrics *outboxprom.Metrics

	mu      sync.Mutex
	claimAt time.Time // the end of the last claim
	// busy: the last claim found events, or has more to read at once
	// (ClaimObservation.More); either way its relay claims again without
	// waiting.
	busy    bool
	foundAt time.Time // the end of the last claim that found events
}

var (
	_ outbox.ClaimObserver       = (*sourceObserver)(nil)
	_ outbox.PublishObserver     = (*sourceObserver)(nil)
	_ outbox.SettleObserver      = (*sourceObserver)(nil)
	_ outbox.CleanupObserver     = (*sourceObserver)(nil)
	_ outbox.DestinationObserver = (*sourceObserver)(nil)
	_ outbox.DurabilityObserver  = (*sourceObserver)(nil)
)

// lastClaim is when the relay's last claim ended (zero: none yet), whether
// its relay claims again without waiting (it found events, or has more to
// read), and when the last claim that found events ended.
func (o *sourceObserver) lastClaim() (at time.Time, busy bool, foundAt time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.claimAt, o.busy, o.foundAt
}

func (o *sourceObserver) ObserveClaim(c outbox.ClaimObservation) {
	// A background full scan that found nothing is followed at once by a
	// claim of the relay's own (outbox's nextClaim): it says nothing of
	// whether the source is busy, and counting it would make a source
	// draining a backlog look idle while that claim runs.
	if c.Err == nil && (!c.FullScan || c.Events > 0) {
		now := time.Now()
		o.mu.Lock()
		o.claimAt, o.busy = now, c.Events > 0 || c.More
		if c.Events > 0 {
			o.foundAt = now
		}
		o.mu.Unlock()
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
