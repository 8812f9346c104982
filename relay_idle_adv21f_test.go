package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestAdvIdleUpkeepComesBackWithTheFirstClaim: RelayConfig.IdleBackoffMax
// says "The first claim that finds an event brings them all back to their
// intervals", and RelayHealth says the health row "is at most one
// HeartbeatInterval old while the relay lives". A relay idle long enough for
// its heartbeat to wait ~8 s is woken by an event its destination cannot
// take: the relay turns not ready at once, yet the heartbeat keeps sleeping
// on the timer it started while idle, so `outbox status` goes on showing
// the relay ready (and its heartbeat unrefreshed) for seconds, up to
// IdleBackoffMax (10 min in a fleet) — far past HeartbeatInterval (100 ms).
func TestAdvIdleUpkeepComesBackWithTheFirstClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	var down atomic.Bool
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		if !down.Load() {
			return nil
		}
		errs := make([]error, len(msgs))
		for i := range errs {
			errs[i] = outbox.Unavailable(errors.New("broker down"))
		}
		return errs
	})
	cfg := quietConfig(schema, pub)
	cfg.DisableNotify, cfg.IdleBackoffMax, cfg.HeartbeatInterval = true, 30*time.Second, 100*time.Millisecond
	r, _ := startRelay(t, pool, cfg)

	// Idle until the heartbeat waits >= 8 s (its row lives 3 waits).
	outboxtest.Eventually(t, 60*time.Second, "heartbeat stretched to >= 8s", func() bool {
		var ms float64
		if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - heartbeat_at) * 1000 FROM `+schema+`.outbox_relays WHERE relay_id = $1`,
			r.ID()).Scan(&ms); err != nil {
			return false
		}
		return time.Duration(ms)*time.Millisecond >= 24*time.Second
	})

	// The destination goes down and an event arrives: the relay claims it
	// and is not ready.
	down.Store(true)
	writeEvents(t, pool, w, 1, 1)
	r.Wake()
	outboxtest.Eventually(t, 10*time.Second, "relay not ready", func() bool { return r.Ready() != nil })
	notReadyAt := time.Now()

	// Within a few HeartbeatIntervals the recorded health must say so.
	deadline := notReadyAt.Add(2 * time.Second)
	for {
		var raw []byte
		if err := pool.QueryRow(ctx, `SELECT coalesce(health, '{}'::jsonb) FROM `+schema+`.outbox_relays WHERE relay_id = $1`, r.ID()).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		var h outbox.RelayHealth
		if err := json.Unmarshal(raw, &h); err != nil {
			t.Fatal(err)
		}
		if !h.Ready && h.Reason != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay not ready since %s (%v), but its heartbeat row still records ready=%v (recorded %s ago): "+
				"the heartbeat's idle wait was not brought back by the claim that found an event",
				time.Since(notReadyAt).Round(time.Millisecond), r.Ready(), h.Ready, time.Since(h.RecordedAt).Round(time.Millisecond))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
