package outbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// lookHolder holds the first claim of a background full scan's look
// (claimLookedSQL: the statement that locks what the look found) until
// released: what a look that walked seconds of entries vacuum cannot remove
// leaves behind, a list of rows read from an old snapshot.
type lookHolder struct {
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *lookHolder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(strings.TrimSpace(d.SQL), "WITH scan AS") && strings.Contains(d.SQL, "unnest($5::uuid[])") {
		h.once.Do(func() {
			h.held <- struct{}{}
			select {
			case <-h.release:
			case <-ctx.Done():
			}
		})
	}
	return ctx
}

func (h *lookHolder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestFullScanLookHoldsNoLockAndIsReChecked: the background full scan reads
// where to look without locking a row, then claims what it found. Between
// the two, the rows it read are free: another relay (here, the test) locks
// and publishes the head it read, and the claim then takes only what is
// still claimable, in order: the next event, never the head again. As one
// statement, the full scan held every row of its window locked for as long
// as its walk over dead entries took under a pinned xmin (22 s in the
// pressure bench), and the other relay's marks of those rows waited.
func TestFullScanLookHoldsNoLockAndIsReChecked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup, schema := outboxtest.Schema(t)
	holder := &lookHolder{held: make(chan struct{}, 1), release: make(chan struct{})}
	pc, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.Tracer = holder
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := quietConfig(schema, b.pub)
	cfg.RescanInterval = 20 * time.Millisecond
	defer close(holder.release)
	startRelay(t, pool, cfg)
	writeEventsFor(t, setup, newWriter(t, schema), "first")
	publishedSoon(t, setup, schema, "an event written after the relay's start", "first")
	// Rows without a dispatch_xid (written before migration 009): only a
	// full scan reads them, so the relay's first (inline) full scan, run
	// before they exist, leaves them to the background ones.
	if _, err := setup.Exec(ctx, `INSERT INTO `+schema+`.outbox_events
		(event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes, dispatch_xid, occurred_at, available_at)
		SELECT gen_random_uuid(), 'order', 'legacy', g, 'Tick', '{}', NULL, now(), now() FROM generate_series(1, 3) g`); err != nil {
		t.Fatal(err)
	}
	select {
	case <-holder.held:
	case <-time.After(30 * time.Second):
		t.Fatal("no background full scan found the legacy rows within 30 s (RescanInterval 20 ms)")
	}
	// The look is done and its claim not sent: every row is free.
	tx, err := setup.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var locked int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+schema+`.outbox_events
		WHERE aggregate_id = 'legacy' FOR UPDATE NOWAIT) l`).Scan(&locked); err != nil {
		t.Fatalf("a row the full scan's look read is locked while its claim waits: %v", err)
	}
	if locked != 3 {
		t.Fatalf("locked %d legacy rows, want 3", locked)
	}
	// Another relay publishes the head meanwhile.
	if _, err := tx.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now()
		WHERE aggregate_id = 'legacy' AND aggregate_sequence = 1`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	holder.release <- struct{}{}
	publishedSoon(t, setup, schema, "the legacy lane after its head was published elsewhere", "legacy")
	msgs := b.streamEvents(t)
	var seqs []int64
	for _, m := range msgs {
		if m.AggregateID == "legacy" {
			seqs = append(seqs, m.Sequence)
		}
	}
	if len(seqs) != 2 || seqs[0] != 2 || seqs[1] != 3 {
		t.Fatalf("the relay published sequences %v of the legacy lane, want [2 3] (1 was published elsewhere)", seqs)
	}
}
