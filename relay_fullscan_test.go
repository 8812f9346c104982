package outbox_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// fullScanHolder holds every full-scan claim after the first until
// released: what a full scan that walks minutes of entries vacuum cannot
// remove looks like to the relay.
type fullScanHolder struct {
	seen    atomic.Int64
	held    chan struct{} // one value when a full scan is held
	release chan struct{}
	once    sync.Once
}

func (h *fullScanHolder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	sql := strings.TrimSpace(d.SQL)
	// The full scan's claim (claimSQL) and the background full scan's look
	// (lookSQL).
	scan := strings.HasPrefix(sql, "WITH scan AS") || strings.HasPrefix(sql, "WITH low AS")
	if scan && h.seen.Add(1) > 1 {
		h.once.Do(func() { h.held <- struct{}{} })
		select { // a real statement ends when its ctx does
		case <-h.release:
		case <-ctx.Done():
		}
	}
	return ctx
}

func (h *fullScanHolder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// heldScanPool returns a pool on the test database whose full-scan claims
// after the first are held by the returned holder until released (or their
// context ends). The pool closes after the test's other cleanups that were
// registered later (the relay's stop).
func heldScanPool(t *testing.T) (*pgxpool.Pool, *fullScanHolder) {
	t.Helper()
	holder := &fullScanHolder{held: make(chan struct{}, 1), release: make(chan struct{})}
	pc, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.Tracer = holder
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, holder
}

// TestFullScanDoesNotStopTheRelay: while a full scan takes long (held here;
// under a transaction open for minutes it took 14 s), the relay goes on
// claiming and publishing what is new. The full scan used to run in the
// relay's loop, which waited for it.
func TestFullScanDoesNotStopTheRelay(t *testing.T) {
	t.Parallel()
	setup, schema := outboxtest.Schema(t)
	pool, holder := heldScanPool(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := quietConfig(schema, b.pub)
	cfg.RescanInterval = 20 * time.Millisecond
	defer close(holder.release) // before the relay's stop (t.Cleanup) waits for the held scan
	startRelay(t, pool, cfg)
	writeEventsFor(t, setup, w, "first")
	publishedSoon(t, setup, schema, "an event written before any full scan is held", "first")
	select {
	case <-holder.held:
	case <-time.After(30 * time.Second):
		t.Fatal("no second full scan within 30 s (RescanInterval 20 ms)")
	}
	writeEventsFor(t, setup, w, "during-1", "during-2")
	publishedSoon(t, setup, schema, "events written while a full scan is held", "during-1", "during-2")
}
