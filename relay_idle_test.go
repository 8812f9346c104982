package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// claimTimes records when each claim that is not a background full scan
// ended, and how many events it claimed.
type claimTimes struct {
	mu     sync.Mutex
	at     []time.Time
	events []int
}

func (c *claimTimes) ObserveClaim(o outbox.ClaimObservation) {
	if o.FullScan || o.Err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = append(c.at, time.Now())
	c.events = append(c.events, o.Events)
}

func (c *claimTimes) snapshot() ([]time.Time, []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.at...), append([]int(nil), c.events...)
}

// TestIdleBackoffStretchesPollsAndUpkeep: with IdleBackoffMax, an idle
// relay's polls wait as long as it has been idle (they double), its
// heartbeat row lives for three of its stretched waits, a wake-up still
// publishes at once, and the first event claimed brings the polls back to
// PollInterval. Without IdleBackoffMax every gap between two polls is
// PollInterval (20 ms) and the heartbeat lives 60 ms.
func TestIdleBackoffStretchesPollsAndUpkeep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	var published sync.Map
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		for _, m := range msgs {
			published.Store(m.ID, true)
		}
		return nil
	})
	claims := &claimTimes{}
	cfg := quietConfig(schema, pub)
	cfg.DisableNotify, cfg.IdleBackoffMax, cfg.HeartbeatInterval, cfg.Observer = true, 5*time.Second, 20*time.Millisecond, claims
	r, _ := startRelay(t, pool, cfg)

	// Idle: 20, 20, 40, 80, 160, 320 ms... between polls.
	outboxtest.Eventually(t, 30*time.Second, "seven empty claims", func() bool { at, _ := claims.snapshot(); return len(at) >= 7 })
	at, _ := claims.snapshot()
	if gap := at[6].Sub(at[5]); gap < 150*time.Millisecond {
		t.Fatalf("gap between the 6th and 7th empty claims %s: want the poll stretched well past PollInterval (20ms)", gap)
	}
	var lives time.Duration
	outboxtest.Eventually(t, 30*time.Second, "heartbeat stretched", func() bool {
		var ms float64
		if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - heartbeat_at) * 1000 FROM `+schema+`.outbox_relays WHERE relay_id = $1`,
			r.ID()).Scan(&ms); err != nil {
			return false
		}
		lives = time.Duration(ms) * time.Millisecond
		return lives >= 300*time.Millisecond
	})

	// A wake-up ends the stretched wait at once.
	recs := writeEvents(t, pool, w, 1, 1)
	before := len(at)
	r.Wake()
	outboxtest.Eventually(t, 10*time.Second, "event published after Wake", func() bool { _, ok := published.Load(recs[0].ID); return ok })
	// Back to PollInterval: after the claim that found the event, the
	// next empty claims follow each other within a few PollIntervals.
	outboxtest.Eventually(t, 30*time.Second, "three empty claims after the busy one", func() bool {
		_, ev := claims.snapshot()
		for i := before; i < len(ev); i++ {
			if ev[i] > 0 {
				return len(ev) >= i+4
			}
		}
		return false
	})
	at, ev := claims.snapshot()
	busy := before
	for ev[busy] == 0 {
		busy++
	}
	// Without the reset the gap is IdleBackoffMax (5 s); with it, a few
	// doubled PollIntervals (20, 40, 80 ms): a second tells them apart
	// on a loaded machine (a CI run saw 174 ms).
	if gap := at[busy+3].Sub(at[busy+2]); gap > time.Second {
		t.Fatalf("gap between two empty claims right after a busy one %s: want PollInterval again (20ms, doubling), far below IdleBackoffMax (5s)", gap)
	}
}
