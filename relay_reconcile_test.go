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

// claimClock records when each claim statement of a pool started, by kind:
// "fresh" (the incremental claim) and "scan" (the full scan).
type claimClock struct {
	mu     sync.Mutex
	starts map[string][]time.Time
	fresh  chan struct{} // a value per incremental claim, when there is room
}

func (c *claimClock) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	sql := strings.TrimSpace(d.SQL)
	for _, kind := range []string{"fresh", "scan"} {
		if strings.HasPrefix(sql, "WITH "+kind+" AS") {
			c.mu.Lock()
			c.starts[kind] = append(c.starts[kind], time.Now())
			c.mu.Unlock()
			if kind == "fresh" {
				select {
				case c.fresh <- struct{}{}:
				default:
				}
			}
		}
	}
	return ctx
}

func (c *claimClock) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *claimClock) times(kind string) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.starts[kind]...)
}

// TestSafetyNetPace: an idle safety net (ReconcileAfter) looks at most
// every ReconcileAfter/4 and runs a full scan at most every 6 ×
// ReconcileAfter, whatever shorter PollInterval and RescanInterval say.
// Beside a healthy CDC stream it finds nothing, and each look still costs
// the database: under a pinned xmin the two safety nets of a group, looking
// every second and scanning every 5 s (at most 5% of their time), took a
// quarter of a core in reads of young events and full scans of up to 7 s
// (issue 27).
func TestSafetyNetPace(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	clock := &claimClock{starts: map[string][]time.Time{}, fresh: make(chan struct{}, 16)}
	pc, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.Tracer = clock
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := quietConfig(schema, b.pub)
	cfg.PollInterval = 5 * time.Millisecond
	cfg.RescanInterval = 5 * time.Millisecond
	cfg.ReconcileAfter = 400 * time.Millisecond
	_, stop := startRelay(t, pool, cfg)
	for range 6 {
		select {
		case <-clock.fresh:
		case <-time.After(30 * time.Second):
			t.Fatal("the safety net made no incremental claim within 30 s")
		}
	}
	stop()
	const look, rescan = 100 * time.Millisecond, 2400 * time.Millisecond
	fresh, scans := clock.times("fresh"), clock.times("scan")
	for i := 1; i < len(fresh); i++ {
		if d := fresh[i].Sub(fresh[i-1]); d < look-5*time.Millisecond {
			t.Errorf("incremental claims %d and %d of an idle safety net %s apart, want at least %s (ReconcileAfter/4)", i, i+1, d, look)
		}
	}
	for i := 1; i < len(scans); i++ {
		if d := scans[i].Sub(scans[i-1]); d < rescan-5*time.Millisecond {
			t.Errorf("full scans %d and %d of a safety net %s apart, want at least %s (6 × ReconcileAfter)", i, i+1, d, rescan)
		}
	}
	if len(scans) == 0 {
		t.Error("no full scan at all: the relay starts with one")
	}
}
