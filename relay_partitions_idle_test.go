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

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// kindChecks counts the statements that read outbox_events' kind from the
// catalogue (partman.IsPartitioned), and when the last one started.
type kindChecks struct {
	n    atomic.Int64
	last atomic.Int64 // unix nanoseconds
}

func (k *kindChecks) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "relkind::text FROM pg_class") {
		k.n.Add(1)
		k.last.Store(time.Now().UnixNano())
	}
	return ctx
}

func (k *kindChecks) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestIdleRelayChecksForAConversionLessOften: a relay on a plain
// outbox_events checks for a conversion to a partitioned table each
// partition round (a minute; 20 ms here). While the relay is idle
// (IdleBackoffMax) the check waits like the rest of its upkeep, longer
// each time; the first event claimed brings it back at once. Without the
// stretch, 200 idle sources of one fleet read the catalogue 3.3 times a
// second (TestFleetFigureIdle: 4.6 transactions/s in all, target 5).
func TestIdleRelayChecksForAConversionLessOften(t *testing.T) {
	t.Parallel()
	base, schema := outboxtest.Schema(t)
	checks := &kindChecks{}
	pcfg := base.Config()
	pcfg.ConnConfig.Tracer = checks
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var published sync.Map
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		for _, m := range msgs {
			published.Store(m.ID, true)
		}
		return nil
	})
	cfg := quietConfig(schema, pub)
	cfg.DisableNotify, cfg.IdleBackoffMax = true, 10*time.Second
	r, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	outbox.SetPartitionCheckEvery(r, 20*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// Idle: the checks spread out until a whole second passes without one
	// (at 20 ms apart, 50 a second would come).
	outboxtest.Eventually(t, 20*time.Second, "a second without a check while idle", func() bool {
		return checks.n.Load() > 1 && time.Since(time.Unix(0, checks.last.Load())) > time.Second
	})
	idleChecks := checks.n.Load()

	// An event claimed ends the idle spell: the stretched wait (up to 10 s
	// by now) is cut back to the 20 ms round, and the relay checks again.
	w := newWriter(t, schema)
	recs := writeEvents(t, pool, w, 1, 1)
	r.Wake()
	outboxtest.Eventually(t, 10*time.Second, "event published", func() bool { _, ok := published.Load(recs[0].ID); return ok })
	claimed := time.Now()
	outboxtest.Eventually(t, 3*time.Second, "a check soon after the claim, not after the stretched wait", func() bool {
		return checks.n.Load() > idleChecks && time.Unix(0, checks.last.Load()).After(claimed.Add(-time.Second))
	})
}
