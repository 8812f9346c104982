package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestRelayVacuumsWhereAutovacuumIsOff: with autovacuum off for
// outbox_events (here by the table's setting, so the test does not depend on
// the server's), a relay vacuums outbox_events and outbox_aggregates itself,
// and two relays of the schema never vacuum at once.
func TestRelayVacuumsWhereAutovacuumIsOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	for _, table := range []string{"outbox_events", "outbox_aggregates"} {
		if _, err := pool.Exec(ctx, "ALTER TABLE "+schema+"."+table+" SET (autovacuum_enabled = false)"); err != nil {
			t.Fatal(err)
		}
	}
	w := newWriter(t, schema)
	writeEvents(t, pool, w, 20, 5)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	for range 2 {
		cfg := quietConfig(schema, b.pub)
		cfg.VacuumInterval = 20 * time.Millisecond
		startRelay(t, pool, cfg)
	}
	outboxtest.Eventually(t, 30*time.Second, "both tables vacuumed twice", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname IN ('outbox_events', 'outbox_aggregates') AND vacuum_count >= 2`, schema).Scan(&n)
		return err == nil && n == 2
	})
	outboxtest.Eventually(t, 30*time.Second, "all published", func() bool { return unpublished(t, pool, schema) == 0 })
}
