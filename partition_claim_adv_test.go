package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// PublishIDs on a partitioned outbox: its claim (claimIDsSQL) is rewritten
// by partitionedSQL like the relay's, and its heads come from the CTE
// lowest, which has no event_id to bound a near lookup by. A lane given
// whole is published whole, in order; a lane given from its second event
// publishes nothing while its first is pending.
func TestPartitionedPublishIDsClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	w := newWriter(t, schema)
	recs := writeEvents(t, pool, w, 2, 2) // agg-0, agg-1; recs[round*2+agg]
	pub := &seenPublisher{}
	r, err := outbox.NewRelay(pool, quietConfig(schema, pub))
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.PublishIDs(ctx, []uuid.UUID{recs[0].ID, recs[2].ID, recs[3].ID})
	if err != nil {
		t.Fatalf("PublishIDs on a partitioned outbox: %v", err)
	}
	if res.Published != 2 || res.Left != 1 {
		t.Fatalf("result %+v; want agg-0 1..2 published, agg-1's 2 left behind its pending 1", res)
	}
	if pub.saw("agg-1", 2) || !pub.saw("agg-0", 1) || !pub.saw("agg-0", 2) {
		t.Fatalf("handed to the destination: %+v", pub.seen)
	}
}

// Every statement partitionedSQL rewrites prepares on a partitioned outbox,
// for a relay and for a safety net beside a CDC stream (ReconcileAfter,
// whose claims carry a further condition on their heads). Before the fix
// claimIDs failed: its heads (the CTE lowest) had no event_id.
func TestPartitionedRewrittenStatementsPrepare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	for _, reconcile := range []time.Duration{0, time.Second} {
		cfg := quietConfig(schema, &seenPublisher{})
		cfg.ReconcileAfter = reconcile
		r, err := outbox.NewRelay(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := outbox.PrepareRewrittenClaims(ctx, r); err != nil {
			t.Errorf("ReconcileAfter %v: %v", reconcile, err)
		}
	}
}
