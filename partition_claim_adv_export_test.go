package outbox

import (
	"context"
	"fmt"
	"strings"
)

// PrepareRewrittenClaims prepares, on one connection of r's pool, each
// statement partitionedSQL rewrites, as r holds them after partitionAware
// (the partitioned ones on a partitioned outbox), for tests in package
// outbox_test: a rewrite that names a column its statement lacks fails
// here, though no test runs that statement, and so does a statement the
// rewrite left as it was (its text no longer matched).
func PrepareRewrittenClaims(ctx context.Context, r *Relay) error {
	r.partitionAware(ctx)
	c, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	for name, sql := range map[string]string{
		"claim": r.sql.claim, "fastClaim": r.sql.fastClaim, "look": r.sql.look,
		"claimLooked": r.sql.claimLooked, "claimIDs": r.sql.claimIDs, "handOffWindow": r.sql.handOffWindow,
	} {
		if !strings.Contains(sql, "::bit(48)::bigint + (") {
			return fmt.Errorf("%s: not rewritten: no near lookup in it", name)
		}
		if _, err := c.Conn().Prepare(ctx, "", sql); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// RelayStatements returns r's statements on outbox_events by name, as r
// runs them (after partitionAware), for tests that look them up in
// pg_prepared_statements.
func RelayStatements(ctx context.Context, r *Relay) map[string]string {
	r.partitionAware(ctx)
	return map[string]string{
		"claim": r.sql.claim, "fastClaim": r.sql.fastClaim, "look": r.sql.look, "claimLooked": r.sql.claimLooked,
		"claimIDs": r.sql.claimIDs, "missingIDs": r.sql.missingIDs, "handOffWindow": r.sql.handOffWindow,
		"handOffSkip": r.sql.handOffSkip, "cursorStart": r.sql.cursorStart, "markPublished": r.sql.markPublished,
		"markFailed": r.sql.markFailed, "release": r.sql.release, "releaseToken": r.sql.releaseToken,
		"probeRoutes": r.sql.probeRoutes, "flagLanes": r.sql.flagLanes, "parkLanes": r.sql.parkLanes,
	}
}
