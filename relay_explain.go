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
// the table). Nothing is claimed.
func (r *Relay) ExplainClaim(ctx context.Context) (string, error) {
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("explain claim: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+r.sql.claim,
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
