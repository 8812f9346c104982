package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

// dbFailureReadyAfter is how long batches must keep failing on the database
// before Ready reports it (docs/operations.md, "Is it healthy?").
const dbFailureReadyAfter = 2 * time.Second

var (
	errNotStarted = errors.New("relay has not finished a batch yet")
	errStopped    = errors.New("relay is not running")
)

// Ready reports whether the relay is doing its job: nil while it runs and its
// last batch reached the database and the destination; otherwise an error
// saying why not (not started or stopped, the database failing for
// dbFailureReadyAfter (2 s) in a row, not one failed batch; the
// destination unavailable, a route the destination refuses). The
// destination counts as unavailable once two consecutive looks at it (a
// batch that published nothing, then the probe or batch after the wait)
// found it so, and until a batch publishes something or, with nothing to
// publish, its publisher's Probe (see Prober) succeeds; a route, once the
// destination refused it twice, until an event held for it is published
// (docs/design.md, "Outages, routes and readiness"). It backs the /readyz
// endpoint of `outbox relay`.
func (r *Relay) Ready() error {
	if !r.running.Load() {
		if p := r.health.Load(); p != nil && *p == errNotStarted {
			return errNotStarted
		}
		return errStopped
	}
	if p := r.health.Load(); p != nil {
		return *p
	}
	return nil
}

func (r *Relay) setHealth(err error) {
	if err == nil {
		r.health.Store(nil)
		return
	}
	r.health.Store(&err)
}

// noteBatch records the outcome of one batch for Ready. It runs on the
// relay's loop, which owns r.outages.
func (r *Relay) noteBatch(err error) {
	if err == nil {
		r.dbFailingSince = time.Time{}
	} else if r.dbFailingSince.IsZero() {
		r.dbFailingSince = time.Now()
	}
	switch {
	case err != nil:
		// One failed batch (a connection killed by a pooler or an
		// operator, a failover's first second) is retried at once and is
		// not worth a 503: only batches failing for dbFailureReadyAfter in
		// a row make the relay not ready.
		if failing := time.Since(r.dbFailingSince); failing >= dbFailureReadyAfter {
			r.setHealth(fmt.Errorf("batches failing for %s, the last: %w", failing.Round(100*time.Millisecond), err))
		}
	case r.outages >= outageReadyAfter:
		r.setHealth(fmt.Errorf("destination unavailable (%d looks in a row): %s", r.outages, r.outageErr))
	default:
		r.setHealth(r.routesHealth())
	}
	if r.obs.destination != nil {
		r.obs.destination.ObserveDestination(DestinationObservation{Unavailable: r.outages >= outageReadyAfter, RefusedRoutes: r.refusedRoutes()})
	}
}

// startMaintenance starts the heartbeat, the lane sweep, the vacuum where
// autovacuum is off and, when configured, the periodic clean-up, and returns the function that stops them (and removes the
// relay's heartbeat row).
func (r *Relay) startMaintenance(ctx context.Context) (stop func()) {
	r.running.Store(true)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.heartbeat(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); r.laneSweepLoop(ctx) }()
	if r.cfg.VacuumInterval > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); r.vacuumLoop(ctx) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); r.partitionLoop(ctx) }()
	if r.cfg.Cleanup.OlderThan > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); r.cleanupLoop(ctx) }()
	}
	return func() {
		cancel()
		wg.Wait()
		r.running.Store(false)
	}
}

// heartbeat records the relay alive in outbox_relays every
// HeartbeatInterval (stretched while idle, see IdleBackoffMax), with its health (recordHealth), until ctx ends, then
// deletes its row.
func (r *Relay) heartbeat(ctx context.Context) {
	host, _ := os.Hostname()
	beat, remove := heartbeatSQL(r.schema)
	health := newHealthRecorder(r.schema)
	first, failing := true, false
	for {
		// The row lives for three waits: an idle relay (IdleBackoffMax)
		// beats less often and stays alive.
		wait, ended := r.upkeepWait(r.cfg.HeartbeatInterval)
		ttl := 3 * wait
		_, err := r.pool.Exec(ctx, beat, r.cfg.ID, host, os.Getpid(), ttl.Milliseconds(), first)
		switch {
		case ctx.Err() != nil:
		case err != nil && !failing:
			failing = true
			r.log.Warn("relay heartbeat failed", slog.Any("error", err))
		case err == nil:
			first, failing = false, false
			r.recordHealth(ctx, health)
		}
		upkeepSleep(ctx, wait, r.cfg.HeartbeatInterval, ended, nil)
		if ctx.Err() != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_, _ = r.pool.Exec(dctx, remove, r.cfg.ID)
			cancel()
			return
		}
	}
}

// cleanupLoop runs the configured clean-up at start and then every
// CleanupInterval until ctx ends.
func (r *Relay) cleanupLoop(ctx context.Context) {
	c := newCleaner(pgtx.Pool(r.pool), r.schema, r.obs.cleanup)
	for {
		res, err := c.run(ctx, r.cfg.Cleanup)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.log.Warn("clean-up failed", slog.Any("error", err), slog.Int64("events_deleted", res.Events),
				slog.Int64("inbox_rows_deleted", res.InboxRows))
		case res.Events > 0 || res.InboxRows > 0:
			r.log.Info("clean-up done", slog.Int64("events_deleted", res.Events), slog.Int64("inbox_rows_deleted", res.InboxRows),
				slog.Int("batches", res.Batches), slog.Duration("took", res.Duration))
		}
		wait, ended := r.upkeepWait(r.cfg.CleanupInterval)
		upkeepSleep(ctx, wait, r.cfg.CleanupInterval, ended, nil)
		if ctx.Err() != nil {
			return
		}
	}
}

// heartbeatSQL returns the statements that record a relay alive (pruning
// relays dead for an hour in the same round trip) and remove it. $5 is true
// on the first heartbeat of a run, which resets started_at.
func heartbeatSQL(s pgident.Schema) (beat, remove string) {
	relays := s.Table("outbox_relays")
	beat = `WITH pruned AS (DELETE FROM ` + relays + ` WHERE expires_at < now() - interval '1 hour' AND relay_id <> $1)
INSERT INTO ` + relays + ` AS r (relay_id, hostname, pid, started_at, heartbeat_at, expires_at)
VALUES ($1, $2, $3, now(), now(), now() + $4 * interval '1 millisecond')
ON CONFLICT (relay_id) DO UPDATE SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid,
	started_at = CASE WHEN $5 THEN now() ELSE r.started_at END,
	heartbeat_at = now(), expires_at = EXCLUDED.expires_at`
	remove = `DELETE FROM ` + relays + ` WHERE relay_id = $1`
	return beat, remove
}

func (r *Relay) observeClaim(b batch, d time.Duration, err error, full bool) {
	if r.obs.claim == nil {
		return
	}
	o := ClaimObservation{Duration: d, Err: err, FullScan: full}
	if err == nil {
		o.Events, o.TakenOver, o.More = b.total, b.takenOver, b.more
	}
	r.obs.claim.ObserveClaim(o)
}

func (r *Relay) observePublish(ev claimedEvent, err error, quarantined bool, ackLatency time.Duration, ackedAt time.Time) {
	if r.obs.publish == nil {
		return
	}
	o := PublishObservation{
		AggregateType: ev.AggregateType, EventType: ev.Type, Attempt: ev.Attempt,
		Err: err, Reason: Reason(err), Quarantined: quarantined, AckLatency: ackLatency,
	}
	if err == nil {
		o.CommitToAck = max(0, ackedAt.Sub(ev.OccurredAt))
	}
	r.obs.publish.ObservePublish(o)
}

func (r *Relay) observeSettle(op SettleOp, events int, rows int64, start time.Time, err error) {
	if r.obs.settle == nil {
		return
	}
	o := SettleObservation{Op: op, Events: events, Duration: time.Since(start), Err: err}
	if err == nil {
		o.LeaseConflicts = events - int(rows)
	}
	r.obs.settle.ObserveSettle(o)
}
