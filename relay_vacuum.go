package outbox

// Vacuum where autovacuum is off: a queue table churns (every event is
// inserted, updated at claim and at settle, deleted by clean-up), and the
// claim's index scan walks every dead entry left behind until a vacuum
// removes it.

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"time"
)

// vacuumLoop vacuums the relay's tables every VacuumInterval while
// autovacuum is off for outbox_events, until ctx ends. It checks each time,
// so turning autovacuum on (or off) needs no restart.
func (r *Relay) vacuumLoop(ctx context.Context) {
	events := r.schema.Table("outbox_events")
	tables := []string{events, r.schema.Table("outbox_aggregates")}
	h := fnv.New64a()
	h.Write([]byte("outbox vacuum " + r.schema.Name()))
	lock := int64(h.Sum64())
	warned, cannot := false, false
	lastClaimed := int64(-1)
	for {
		wait, ended := r.upkeepWait(r.cfg.VacuumInterval)
		upkeepSleep(ctx, wait, r.cfg.VacuumInterval, ended, nil)
		if ctx.Err() != nil {
			return
		}
		if r.idleSinceVacuum(lastClaimed) {
			continue
		}
		lastClaimed = r.claimed.Load()
		// VACUUM by a role that does not own the table (before
		// PostgreSQL 17's MAINTAIN privilege) skips it with a warning
		// that the client never sees: check first.
		var off, may bool
		if err := r.pool.QueryRow(ctx, `SELECT NOT current_setting('autovacuum')::bool
	OR NOT coalesce((SELECT option_value::bool FROM pg_options_to_table(c.reloptions)
		WHERE option_name = 'autovacuum_enabled'), true),
	pg_has_role(c.relowner, 'USAGE')
FROM pg_class c WHERE c.oid = $1::regclass`, events).Scan(&off, &may); err != nil {
			if ctx.Err() == nil {
				r.log.Warn("vacuum: cannot read the autovacuum setting", slog.Any("error", err))
			}
			continue
		}
		if !off {
			warned, cannot = false, false
			continue
		}
		if !may {
			if !cannot {
				r.log.Warn("autovacuum is off for the outbox tables and the relay's role does not own them, so it cannot vacuum them: turn autovacuum on (see docs/operations.md) or vacuum them as their owner",
					slog.String("table", events))
				cannot = true
			}
			continue
		}
		if !warned {
			r.log.Warn("autovacuum is off for the outbox tables: the relay vacuums them itself (turn autovacuum on in production, see docs/operations.md)",
				slog.Duration("every", r.cfg.VacuumInterval))
			warned = true
		}
		start := time.Now()
		ran, err := r.vacuum(ctx, lock, tables)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.log.Warn("vacuum failed", slog.Any("error", err))
		case ran:
			r.log.Info("vacuumed the outbox tables", slog.Duration("took", time.Since(start)))
		}
	}
}

// vacuum runs VACUUM (ANALYZE) on tables unless another relay of the schema
// holds lock (it is vacuuming them now). It reports whether it ran.
func (r *Relay) vacuum(ctx context.Context, lock int64, tables []string) (bool, error) {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("vacuum: %w", err)
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, lock).Scan(&got); err != nil || !got {
		return false, err
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lock); err != nil {
			conn.Conn().Close(context.WithoutCancel(ctx)) // a session lock must not go back to the pool
		}
	}()
	for _, t := range tables {
		if _, err := conn.Exec(ctx, "VACUUM (ANALYZE) "+t); err != nil {
			return true, fmt.Errorf("vacuum %s: %w", t, err)
		}
	}
	return true, nil
}
