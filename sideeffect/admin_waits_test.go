package sideeffect_test

import (
	"context"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/sideeffect"
)

// TestCountWaitsIsBounded: Admin.CountWaits counts the waiting events up
// to CountWaitsMax and says when there are more, and a schema without the
// side_effect_waits table (before migration 16) has none, for Waits too.
func TestCountWaitsIsBounded(t *testing.T) {
	b := setup(t, sideeffect.Neither)
	ctx := context.Background()
	insert := func(n int) {
		t.Helper()
		if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.side_effect_waits (consumer_name, event_id, name, key, aggregate_type, aggregate_id,
	sequence, event_type, schema_version, content_type, payload)
SELECT 'payments', gen_random_uuid(), 'payments.charge', 'k' || i, 'order', 'ord-' || i, 1, 'OrderPlaced', 1, 'application/json', '\x7b7d'
FROM generate_series(1, $1) i`, n); err != nil {
			t.Fatal(err)
		}
	}
	insert(sideeffect.CountWaitsMax)
	if n, more, err := b.admin.CountWaits(ctx); err != nil || n != sideeffect.CountWaitsMax || more {
		t.Fatalf("CountWaits of %d waits: %d, %v, %v", sideeffect.CountWaitsMax, n, more, err)
	}
	insert(1)
	if n, more, err := b.admin.CountWaits(ctx); err != nil || n != sideeffect.CountWaitsMax || !more {
		t.Fatalf("CountWaits of %d waits: %d, %v, %v; want %d and more", sideeffect.CountWaitsMax+1, n, more, err, sideeffect.CountWaitsMax)
	}

	pool, empty := outboxtest.Schema(t)
	if _, err := pool.Exec(ctx, `DROP TABLE `+empty+`.side_effect_waits`); err != nil {
		t.Fatal(err)
	}
	admin, err := sideeffect.NewAdmin(pool, sideeffect.AdminConfig{Schema: empty})
	if err != nil {
		t.Fatal(err)
	}
	if n, more, err := admin.CountWaits(ctx); err != nil || n != 0 || more {
		t.Fatalf("CountWaits without the table: %d, %v, %v", n, more, err)
	}
	if page, err := admin.Waits(ctx, sideeffect.WaitsFilter{}); err != nil || len(page.Waits) != 0 || page.Next != nil {
		t.Fatalf("Waits without the table: %+v, %v", page, err)
	}
}
