package outbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ExplainClaim runs the relay's claim statement under EXPLAIN (ANALYZE,
// BUFFERS) in a transaction that it rolls back, and returns the plan: what an
// operator looks at when claims get slow (the claim must use
// outbox_dispatch_idx and outbox_pending_lane_idx, never a sequential scan of
// the table). Nothing is claimed. On a partitioned outbox it runs with JIT
// off, as the relay's claims do (relay_partition_plan.go).
func (r *Relay) ExplainClaim(ctx context.Context) (string, error) {
	r.partitionAware(ctx)
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("explain claim: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := r.planned(tx).Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+r.sql.claim,
		r.cfg.BatchSize, r.cfg.ID, uuid.New(), r.cfg.LeaseDuration.Milliseconds())
	if err != nil {
		return "", fmt.Errorf("explain claim: %w", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("explain claim: %w", err)
	}
	return strings.Join(lines, "\n") + "\n", nil
}

// ExplainFreshClaim is ExplainClaim for the incremental claim (see
// RelayConfig.RescanInterval): the statement most of a relay's claims run,
// from where the relay's cursor stands now (set first if the relay has not
// claimed yet). Its cost should not grow with the events published before
// the cursor, whatever transaction is held open. Nothing is claimed and the
// cursor does not move.
func (r *Relay) ExplainFreshClaim(ctx context.Context) (string, error) {
	r.partitionAware(ctx)
	if !r.cursor.isValid() {
		if err := r.startCursor(ctx); err != nil {
			return "", fmt.Errorf("explain claim: %w", err)
		}
	}
	args, cont := r.cursor.freshArgs()
	defer r.cursor.restore(cont)
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("explain claim: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := r.planned(tx).Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+r.sql.fastClaim,
		append([]any{r.cfg.BatchSize, r.cfg.ID, uuid.New(), r.cfg.LeaseDuration.Milliseconds()}, args...)...)
	if err != nil {
		return "", fmt.Errorf("explain claim: %w", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("explain claim: %w", err)
	}
	return strings.Join(lines, "\n") + "\n", nil
}
