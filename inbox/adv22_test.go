package inbox_test

import (
	"context"
	"testing"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestAdv22AHandlerThatPanicsLeavesNoTransactionOpen: an effect that
// panics, recovered by the application (net/http recovers a handler's
// panic; consumer loops often do), must not leave the delivery's
// transaction open: on pgx, BeginTxFunc rolls back as the panic passes;
// over database/sql the transaction, the connection it holds and the
// lock on the aggregate's mark row stayed until the context ended, which
// with context.Background is never: the aggregate's later events then
// block for ever behind it.
func TestAdv22AHandlerThatPanicsLeavesNoTransactionOpen(t *testing.T) {
	t.Parallel()
	forKinds(t, func(t *testing.T, k txKind) {
		pool, schema := outboxtest.Schema(t)
		in := k.newInbox(t, pool, inbox.Config{Tables: outbox.Schema(schema), Consumer: "c1"})
		// Cancelled when the test ends (before the database/sql database
		// is closed, which would wait for a leaked transaction for ever):
		// database/sql rolls back a transaction whose context ends.
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		m := msg("o1", 1)
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("the effect's panic did not pass through")
				}
			}()
			_, _ = k.handle(ctx, in, m, func(ctx context.Context, exec execFunc) error { panic("effect bug") })
		}()
		// The mark row is created in the delivery's transaction: once that
		// is rolled back, nobody holds a lock on it (NOWAIT: no waiting).
		var open int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND state LIKE 'idle in transaction%' AND query LIKE '%`+schema+`%'`).Scan(&open); err != nil {
			t.Fatal(err)
		}
		if open != 0 {
			t.Fatalf("%d transactions of this schema's inbox left open after a recovered panic in the effect", open)
		}
		got, err := k.handle(ctx, in, m, func(ctx context.Context, exec execFunc) error { return nil })
		if err != nil || got != inbox.Applied {
			t.Fatalf("redelivery after the panic: %v, %v; want Applied", got, err)
		}
	})
}
