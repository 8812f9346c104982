package outbox

// The start-up check of what the destination's acknowledgement is worth
// (see DurabilityChecker): once per Run, logged once, observed once, and
// recorded in the relay's heartbeat row for `outbox status`.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/pgoutbox/outbox/internal/pgident"
)

// Bounds of the durability check.
const (
	// durabilityCheckTimeout bounds one CheckDurability call in the
	// background; durabilityFirstTimeout the first one, which Run waits for
	// before its first claim.
	durabilityCheckTimeout = 10 * time.Second
	durabilityFirstTimeout = 3 * time.Second
	// durabilityRetryMin and durabilityRetryMax bound the backoff between
	// two checks that could not ask the destination.
	durabilityRetryMin = time.Second
	durabilityRetryMax = time.Minute
)

// ackState is what the relay learnt about its destination's
// acknowledgement (Relay.AckDurability).
type ackState struct {
	mu   sync.Mutex
	last *AckDurability
}

func (s *ackState) set(a AckDurability) {
	s.mu.Lock()
	s.last = &a
	s.mu.Unlock()
}

// startAckDurabilityCheck checks the destination's acknowledgement once: the
// first attempt before it returns (so that the relay's first claim comes
// after the warning and the metric), further attempts in the background
// while the destination cannot be asked. The result is logged and observed
// once and written into the relay's heartbeat row. The returned function
// stops the background work and waits for it; call it before the heartbeat
// row is removed.
func (r *Relay) startAckDurabilityCheck(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	checker, ok := r.cfg.Publisher.(DurabilityChecker)
	var first AckDurability
	if ok {
		first = r.checkAck(ctx, checker, 1)
	} else {
		first = AckDurability{
			DurabilityReport: DurabilityReport{Reason: AckNotChecked,
				Summary: "the publisher cannot tell what its destination's acknowledgement is worth (it is not an outbox.DurabilityChecker)"},
			CheckedAt: time.Now().UTC(),
		}
		r.noteAck(first)
	}
	go func() {
		defer close(done)
		a := first
		for n := 1; a.Reason == AckCheckPending && ctx.Err() == nil; n++ {
			if n == 1 {
				// Replaces what an earlier run under the same relay ID
				// may have left in the row.
				r.recordAck(ctx, a)
			}
			sleep(ctx, backoff(n, durabilityRetryMin, durabilityRetryMax))
			if ctx.Err() != nil {
				return
			}
			a = r.checkAck(ctx, checker, n+1)
		}
		r.recordAck(ctx, a)
	}()
	return func() { cancel(); <-done }
}

// checkAck asks checker once. A report is noted (logged, observed, kept); a
// failure to ask is logged on the first attempt only and returned as a
// pending AckDurability.
func (r *Relay) checkAck(ctx context.Context, checker DurabilityChecker, attempt int) AckDurability {
	timeout := durabilityCheckTimeout
	if attempt == 1 {
		timeout = durabilityFirstTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	rep, err := checker.CheckDurability(cctx)
	cancel()
	now := time.Now().UTC()
	if err != nil {
		a := AckDurability{DurabilityReport: DurabilityReport{Reason: AckCheckPending,
			Summary: "not checked yet: " + err.Error()}, CheckedAt: now}
		r.ack.set(a)
		if attempt == 1 && ctx.Err() == nil {
			r.log.Warn("could not check what the destination's acknowledgement is worth; trying again",
				slog.Any("error", err))
		}
		return a
	}
	a := AckDurability{Checked: true, DurabilityReport: rep, CheckedAt: now}
	r.noteAck(a)
	return a
}

// noteAck keeps a, logs it and tells the observer.
func (r *Relay) noteAck(a AckDurability) {
	r.ack.set(a)
	attrs := []any{slog.String("destination", a.Destination), slog.String("reason", a.Reason), slog.String("detail", a.Summary)}
	switch {
	case !a.Checked:
		r.log.Info("destination acknowledgement not checked", attrs...)
	case a.Durable:
		r.log.Info("destination acknowledgement is durable", attrs...)
	default:
		r.log.Warn("destination acknowledgement is not durable: an event marked published can be lost with the broker (I3)", attrs...)
	}
	if r.obs.durability != nil {
		r.obs.durability.ObserveAckDurability(a)
	}
}

// recordAck writes a into the relay's heartbeat row (creating the row if
// the first heartbeat has not yet), retrying with backoff until it is
// written or ctx ends.
func (r *Relay) recordAck(ctx context.Context, a AckDurability) {
	doc, err := json.Marshal(a)
	if err != nil {
		r.log.Warn("record the destination's acknowledgement durability", slog.Any("error", err))
		return
	}
	host, _ := os.Hostname()
	ttl := 3 * r.cfg.HeartbeatInterval
	q := ackDurabilitySQL(r.schema)
	for n := 1; ; n++ {
		_, err := r.pool.Exec(ctx, q, r.cfg.ID, host, os.Getpid(), ttl.Milliseconds(), string(doc))
		if err == nil || ctx.Err() != nil {
			return
		}
		if n == 1 {
			r.log.Warn("record the destination's acknowledgement durability in outbox_relays",
				slog.Any("error", fmt.Errorf("%w (is the schema migrated?)", err)))
		}
		sleep(ctx, backoff(n, durabilityRetryMin, durabilityRetryMax))
	}
}

// ackDurabilitySQL upserts a relay's ack_durability (migration 010),
// leaving the heartbeat's columns to the heartbeat when the row exists.
func ackDurabilitySQL(s pgident.Schema) string {
	relays := s.Table("outbox_relays")
	return `INSERT INTO ` + relays + ` AS r (relay_id, hostname, pid, started_at, heartbeat_at, expires_at, ack_durability)
VALUES ($1, $2, $3, now(), now(), now() + $4 * interval '1 millisecond', $5::jsonb)
ON CONFLICT (relay_id) DO UPDATE SET ack_durability = EXCLUDED.ack_durability`
}
