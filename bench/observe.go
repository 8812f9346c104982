package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/pgoutbox/outbox"
)

// phases adds up where a relay spends its time, through the relay's
// observer hooks: claim round trips, publish calls (until the broker's
// acks) and mark-published round trips.
type phases struct {
	mu                    sync.Mutex
	claims, emptyClaims   int
	claimed               int
	claimTime             time.Duration
	publishCalls          int
	publishTime           time.Duration
	lastPublish           time.Duration // to count each call once
	lastPublishEventCount int
	marks                 int
	markTime              time.Duration
}

var (
	_ outbox.ClaimObserver   = (*phases)(nil)
	_ outbox.PublishObserver = (*phases)(nil)
	_ outbox.SettleObserver  = (*phases)(nil)
)

func (p *phases) ObserveClaim(o outbox.ClaimObservation) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.claims++
	p.claimed += o.Events
	if o.Events == 0 {
		p.emptyClaims++
	}
	p.claimTime += o.Duration
}

// ObservePublish is called once per event with the duration of the Publish
// call that carried it; consecutive events with the same duration belong to
// one call (a wave), which is close enough for a time budget.
func (p *phases) ObservePublish(o outbox.PublishObservation) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if o.AckLatency != p.lastPublish {
		p.publishCalls++
		p.publishTime += o.AckLatency
		p.lastPublish = o.AckLatency
	}
}

func (p *phases) ObserveSettle(o outbox.SettleObservation) {
	if o.Op != outbox.SettleMarkPublished {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marks++
	p.markTime += o.Duration
}

// String summarises the phases over elapsed wall time.
func (p *phases) String(elapsed time.Duration) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	pct := func(d time.Duration) float64 { return 100 * d.Seconds() / elapsed.Seconds() }
	avg := func(d time.Duration, n int) float64 {
		if n == 0 {
			return 0
		}
		return ms(d) / float64(n)
	}
	perClaim := 0.0
	if full := p.claims - p.emptyClaims; full > 0 {
		perClaim = float64(p.claimed) / float64(full)
	}
	return fmt.Sprintf("claims %d (%d empty, %.0f events each) %.2f ms avg, %.0f%% of wall time; publish calls %d, %.2f ms avg, %.0f%%; marks %d, %.2f ms avg, %.0f%%",
		p.claims, p.emptyClaims, perClaim, avg(p.claimTime, p.claims), pct(p.claimTime),
		p.publishCalls, avg(p.publishTime, p.publishCalls), pct(p.publishTime),
		p.marks, avg(p.markTime, p.marks), pct(p.markTime))
}
