package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestLoneUnavailableEventIsCountedAsFailing: a destination that reports a
// message-specific problem as an outage (issue 8, item 1: the general rule)
// must not hold that event, without an attempt ever spent, forever. After
// LoneOutageLimit claims in which it alone failed as unavailable while
// others were published, its failures count: attempts are spent and it is
// quarantined after MaxAttempts. The rest flows, and a real outage (every
// event unavailable) still spends nothing.
func TestLoneUnavailableEventIsCountedAsFailing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "agg-1" && m.Sequence == 1 {
			return outbox.Unavailable(errors.New("connection closed (maximum control line exceeded)"))
		}
		return nil
	}}
	writeEvents(t, pool, w, 4, 1)
	cfg := quietConfig(schema, pub)
	cfg.MaxAttempts, cfg.LoneOutageLimit = 2, 2
	r, _ := startRelay(t, pool, cfg)

	// The other three are published on the first claim; agg-1 #1 needs
	// more claims, each with other events published beside it, so keep
	// writing to the healthy aggregates.
	outboxtest.Eventually(t, 60*time.Second, "agg-1 #1 quarantined", func() bool {
		writeEventsFor(t, pool, w, "agg-0", "agg-2")
		e, err := newAdmin(t, pool, schema).Event(ctx, eventID(t, pool, schema, "agg-1", 1))
		return err == nil && e.State() == "quarantined"
	})
	var attempts int
	var lastErr string
	if err := pool.QueryRow(ctx, `SELECT attempt_count, last_error FROM `+schema+`.outbox_events WHERE aggregate_id = 'agg-1' AND aggregate_sequence = 1`).
		Scan(&attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if attempts != 2 || !strings.Contains(lastErr, "counted as this event's failure") || r.Stats().Quarantined != 1 {
		t.Fatalf("attempts %d, last_error %q, quarantined %d: want 2 attempts spent, the reason, 1 quarantined", attempts, lastErr, r.Stats().Quarantined)
	}
	outboxtest.Eventually(t, 30*time.Second, "the others published", func() bool { return unpublished(t, pool, schema) == 1 })
}

// writeEventsFor writes one event to each of the given aggregates, in one
// transaction.
func writeEventsFor(t *testing.T, pool *pgxpool.Pool, w *outbox.Writer, ids ...string) {
	t.Helper()
	ctx := context.Background()
	evs := make([]outbox.Event, len(ids))
	for i, id := range ids {
		evs[i] = orderEvent(id, "Tick")
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.InsertTx(ctx, tx, evs...); return err }); err != nil {
		t.Fatal(err)
	}
}
