package outbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// kindChecks records when each statement that reads outbox_events' kind
// from the catalogue (partman.IsPartitioned) started.
type kindChecks struct {
	mu    sync.Mutex
	times []time.Time
}

func (k *kindChecks) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "relkind::text FROM pg_class") {
		k.mu.Lock()
		k.times = append(k.times, time.Now())
		k.mu.Unlock()
	}
	return ctx
}

func (k *kindChecks) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (k *kindChecks) snapshot() []time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]time.Time(nil), k.times...)
}

// quietFor reports whether there were at least two checks and none for d.
func (k *kindChecks) quietFor(d time.Duration) bool {
	ts := k.snapshot()
	return len(ts) > 1 && time.Since(ts[len(ts)-1]) > d
}

// idleRelay runs a relay publishing to pub, with IdleBackoffMax idleMax
// and its partition round every (the test hook) instead of a minute, on a
// pool of its own whose statements checks watches.
func idleRelay(t *testing.T, base *pgxpool.Pool, schema string, pub outbox.Publisher, idleMax, every time.Duration) (*outbox.Relay, *kindChecks) {
	t.Helper()
	checks := &kindChecks{}
	pcfg := base.Config()
	pcfg.ConnConfig.Tracer = checks
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg := quietConfig(schema, pub)
	cfg.DisableNotify, cfg.IdleBackoffMax = true, idleMax
	r, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	outbox.SetPartitionCheckEvery(r, every)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r, checks
}

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
	var published sync.Map
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		for _, m := range msgs {
			published.Store(m.ID, true)
		}
		return nil
	})
	r, checks := idleRelay(t, base, schema, pub, 10*time.Second, 20*time.Millisecond)

	// Idle: the checks spread out until a whole second passes without one
	// (at 20 ms apart, 50 a second would come).
	outboxtest.Eventually(t, 20*time.Second, "a second without a check while idle", func() bool {
		return checks.quietFor(time.Second)
	})
	idleChecks := len(checks.snapshot())

	// An event claimed ends the idle spell: the stretched wait (up to 10 s
	// by now) is cut back to the 20 ms round, and the relay checks again.
	w := newWriter(t, schema)
	recs := writeEvents(t, base, w, 1, 1)
	r.Wake()
	outboxtest.Eventually(t, 10*time.Second, "event published", func() bool { _, ok := published.Load(recs[0].ID); return ok })
	claimed := time.Now()
	outboxtest.Eventually(t, 3*time.Second, "a check soon after the claim, not after the stretched wait", func() bool {
		ts := checks.snapshot()
		return len(ts) > idleChecks && ts[len(ts)-1].After(claimed.Add(-time.Second))
	})
}
