package outbox

// Idle backoff (RelayConfig.IdleBackoffMax): a relay whose claims keep
// finding nothing stretches its polls and its periodic upkeep (heartbeat,
// lane sweep, vacuum, clean-up), so that hundreds of idle relays in one
// process (package outboxfleet) cost the database a few queries a second in
// all. Each wait becomes as long as the relay has been idle, between its
// interval and IdleBackoffMax: the waits double while nothing happens, and
// the first claim that finds an event brings them all back.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// idleClock records since when the relay's claims have found nothing.
type idleClock struct {
	since atomic.Int64 // unix nanoseconds of the first empty claim of the current spell; 0: not idle

	mu sync.Mutex
	// ended is closed when the current idle spell ends (a claim finds an
	// event), waking the upkeep waits stretched during it; nil until one
	// asks for it.
	ended chan struct{}
}

// noteClaim records a claim's outcome: n events claimed at now.
func (c *idleClock) noteClaim(n int, now time.Time) {
	if n > 0 {
		if c.since.Load() == 0 {
			return
		}
		c.mu.Lock()
		c.since.Store(0)
		if c.ended != nil {
			close(c.ended)
			c.ended = nil
		}
		c.mu.Unlock()
		return
	}
	c.since.CompareAndSwap(0, now.UnixNano())
}

// spellEnd returns a channel closed when the current idle spell ends, or
// nil when the relay is not idle.
func (c *idleClock) spellEnd() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.since.Load() == 0 {
		return nil
	}
	if c.ended == nil {
		c.ended = make(chan struct{})
	}
	return c.ended
}

// idleFor is how long the relay has been idle at now (0: it is not).
func (c *idleClock) idleFor(now time.Time) time.Duration {
	s := c.since.Load()
	if s == 0 {
		return 0
	}
	return max(now.Sub(time.Unix(0, s)), 0)
}

// idleStretch is the wait before the next poll when PollInterval is base:
// base while the relay is busy or IdleBackoffMax is off; while it is idle,
// as long as it has been idle, at least base and at most IdleBackoffMax (or
// base, if longer): the waits double.
func (r *Relay) idleStretch(base time.Duration) time.Duration {
	return stretchIdle(base, r.idle.idleFor(time.Now()), r.cfg.IdleBackoffMax)
}

// upkeepFactor is how much longer than the relay has been idle the upkeep
// waits: its waits grow five-fold each time, so that a fleet of idle relays
// reaches its floor within minutes (a heartbeat every 10 s, 50 s, 250 s,
// then IdleBackoffMax).
const upkeepFactor = 4

// upkeepStretch is the wait before a periodic upkeep task (heartbeat, lane
// sweep, vacuum, clean-up) whose interval is base: base while the relay is
// busy or IdleBackoffMax is off; while it is idle, four times as long as it
// has been idle, at least base and at most IdleBackoffMax (or base).
func (r *Relay) upkeepStretch(base time.Duration) time.Duration {
	return stretchIdle(base, upkeepFactor*r.idle.idleFor(time.Now()), r.cfg.IdleBackoffMax)
}

// upkeepWait is upkeepStretch(base) with a channel closed when the idle
// spell it was stretched for ends (nil when it was not stretched), for
// upkeepSleep: the channel is taken first, so that a spell ending in
// between is not missed.
func (r *Relay) upkeepWait(base time.Duration) (time.Duration, <-chan struct{}) {
	var ended <-chan struct{}
	if r.cfg.IdleBackoffMax > 0 {
		ended = r.idle.spellEnd()
	}
	return r.upkeepStretch(base), ended
}

// upkeepSleep waits d (from upkeepWait), until ctx ends or wake receives;
// when ended closes (the first claim that finds an event after an idle
// spell) the wait is cut back to base from its start, so that the upkeep
// returns to its interval at once rather than after the stretched wait.
func upkeepSleep(ctx context.Context, d, base time.Duration, ended <-chan struct{}, wake <-chan struct{}) {
	start := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
			return
		case <-t.C:
			return
		case <-ended:
			ended = nil
			t.Reset(max(base-time.Since(start), 0))
		}
	}
}

// idleSinceVacuum reports whether the relay, with IdleBackoffMax set, has
// claimed nothing since its last vacuum (claimed is the count then): its own
// work left no dead tuples to remove, and the vacuum (and its check) is
// skipped.
func (r *Relay) idleSinceVacuum(claimed int64) bool {
	return r.cfg.IdleBackoffMax > 0 && r.claimed.Load() == claimed && r.idle.idleFor(time.Now()) > 0
}

func stretchIdle(base, idleFor, limit time.Duration) time.Duration {
	if limit <= 0 || idleFor <= base {
		return base
	}
	return min(idleFor, max(base, limit))
}
