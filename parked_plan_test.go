package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestQuarantineStatementsReadOnlyQuarantinedEvents: the lane sweep, the
// quarantine list and count and status's count of blocked events look for
// quarantined events through outbox_quarantine_key_idx (migration 017),
// whatever the statistics their plans were made on: never through a walk of
// an index of every pending event, which under a pinned xmin reads every
// dead entry (the pressure bench's lane sweep: 413,071 buffers, 3.6 s, to
// find nothing). Planned generic, as a relay's prepared statement is kept,
// on an empty table's statistics, a young table's, and under a pinned xmin
// with most events published.
func TestQuarantineStatementsReadOnlyQuarantinedEvents(t *testing.T) {
	t.Parallel()
	for _, stats := range []string{"analyzed empty", "analyzed young", "analyzed under a pinned xmin"} {
		t.Run(stats, func(t *testing.T) {
			t.Parallel()
			quarantinePlansUseTheirIndex(t, stats)
		})
	}
}

func quarantinePlansUseTheirIndex(t *testing.T, stats string) {
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	events := schema + ".outbox_events"
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	switch stats {
	case "analyzed young":
		exec(`INSERT INTO ` + events + ` (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes, published_at)
			SELECT gen_random_uuid(), 'order', 'y' || (g % 50), g, 'OrderCreated', '{}', CASE WHEN g <= 250 THEN now() END
			FROM generate_series(1, 300) g`)
		exec(`ANALYZE ` + events)
	case "analyzed empty":
		exec(`ANALYZE ` + events)
	case "analyzed under a pinned xmin":
		pinXmin(t)
		exec(`INSERT INTO ` + events + ` (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes)
			SELECT gen_random_uuid(), 'order', 'o' || (g % 2000), g, 'OrderCreated', '{}' FROM generate_series(1, 20000) g`)
		exec(`UPDATE ` + events + ` SET published_at = now() WHERE aggregate_sequence > 20`)
		exec(`UPDATE ` + events + ` SET quarantined_at = now() WHERE aggregate_sequence = 3`)
		exec(`ANALYZE ` + events)
	}
	if stats == "analyzed young" || stats == "analyzed empty" {
		// The table grows after the statistics were taken (with
		// autovacuum off, nothing takes them again).
		exec(`INSERT INTO ` + events + ` (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes)
			SELECT gen_random_uuid(), 'order', 'o' || g, 1, 'OrderCreated', '{}' FROM generate_series(1, 20000) g`)
	}
	// Every lane has its counter row, as the writer keeps them.
	exec(`INSERT INTO ` + schema + `.outbox_aggregates (aggregate_type, aggregate_id, last_sequence)
		SELECT aggregate_type, aggregate_id, max(aggregate_sequence) FROM ` + events + ` GROUP BY 1, 2`)
	stmts, err := outbox.QuarantineStatements(schema)
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]string{"list": "(10, 100)", "count": "(10)"}
	pending := []string{"outbox_pending_lane_idx", "outbox_dispatch_idx", "outbox_fresh_key_idx", "outbox_due_idx"}
	for name, stmt := range stmts {
		plan := explainPrepared(t, pool, "q_"+name, stmt, "force_generic_plan", args[name])
		text := strings.Join(plan, "\n")
		if !strings.Contains(text, "outbox_quarantine_key_idx") {
			t.Errorf("%s: the plan does not read outbox_quarantine_key_idx:\n%s", name, text)
		}
		for i, line := range plan {
			if strings.Contains(line, "Seq Scan on outbox_events") {
				t.Errorf("%s: the statement scans the table:\n%s", name, text)
			}
			for _, idx := range pending {
				if !strings.Contains(line, " "+idx+" ") {
					continue
				}
				// A probe of a lane by its key is fine; a walk is not.
				cond := false
				for _, next := range plan[i+1:] {
					if strings.Contains(next, "->") {
						break
					}
					cond = cond || strings.Contains(next, "Index Cond")
				}
				if !cond {
					t.Errorf("%s: %s is walked without a condition on its key:\n%s", name, idx, text)
				}
			}
		}
	}
}
