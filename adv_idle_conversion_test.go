package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// advIdleRelay starts a relay with IdleBackoffMax idleMax on a plain
// outbox_events whose pool counts the catalogue reads of the conversion
// check (kindChecks); every > 0 shrinks the partition round (test hook).
func advIdleRelay(t *testing.T, base *pgxpool.Pool, schema string, idleMax, every time.Duration) *kindChecks {
	t.Helper()
	checks := &kindChecks{}
	pcfg := base.Config()
	pcfg.ConnConfig.Tracer = checks
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error { return nil })
	cfg := quietConfig(schema, pub)
	cfg.DisableNotify, cfg.IdleBackoffMax = true, idleMax
	r, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if every > 0 {
		outbox.SetPartitionCheckEvery(r, every)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return checks
}

func advWriteOne(ctx context.Context, pool *pgxpool.Pool, w *outbox.Writer) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.InsertTx(ctx, tx, orderEvent("adv-idle", "Tick"))
		return err
	})
}

// TestAdvIdleConversionWhileIdleCoveredKeepsWriters (expected to hold):
// the relay idles with its conversion check stretched (IdleBackoffMax 2 s,
// rounds of 200 ms), the table is converted with 1 s partitions, 4 ahead
// (interval x ahead > IdleBackoffMax, the documented condition); no event
// is written until well past what the conversion made ahead: the relay
// must have noticed the conversion and made partitions meanwhile, so the
// write is accepted.
func TestAdvIdleConversionWhileIdleCoveredKeepsWriters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, schema := outboxtest.Schema(t)
	checks := advIdleRelay(t, base, schema, 2*time.Second, 200*time.Millisecond)
	outboxtest.Eventually(t, 20*time.Second, "a second without a check while idle", func() bool {
		return checks.n.Load() > 1 && time.Since(time.Unix(0, checks.last.Load())) > time.Second
	})
	res, err := outboxmigrate.Partition(ctx, base, schema, outboxmigrate.PartitionConfig{Interval: time.Second, Ahead: 4})
	if err != nil {
		t.Fatal(err)
	}
	converted := time.Now()
	t.Logf("conversion made %v", res.Created)
	// The conversion's partitions end by converted+5s (+1s for the clock's
	// alignment); write past that.
	outboxtest.Eventually(t, 20*time.Second, "past the conversion's partitions", func() bool {
		return time.Since(converted) > 7*time.Second
	})
	if err := advWriteOne(ctx, base, newWriter(t, schema)); err != nil {
		t.Fatalf("a write %s after a conversion covered by interval x ahead (4 s > IdleBackoffMax 2 s): %v (ErrNoPartition: %v)",
			time.Since(converted).Round(time.Millisecond), err, errors.Is(err, outbox.ErrNoPartition))
	}
}

// checkTimes records when each catalogue read of the conversion check
// started.
type checkTimes struct {
	kindChecks
	mu    sync.Mutex
	times []time.Time
}

func (c *checkTimes) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "relkind::text FROM pg_class") {
		c.mu.Lock()
		c.times = append(c.times, time.Now())
		c.mu.Unlock()
	}
	return ctx
}

func (c *checkTimes) snapshot() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.times...)
}

// TestAdvIdleFirstClaimAfterConversionBringsTheCheckBack (expected to
// hold): the relay idles with its check stretched to 16 s; the table is
// converted (1 s partitions, 4 ahead) right after a stretched check and an
// event is written at once and claimed (Wake): the idle spell ends, the
// check comes back to its 200 ms round, notices the conversion and makes
// partitions, so a write 9 s later (past the conversion's, before the
// stretched wait's end) is accepted.
func TestAdvIdleFirstClaimAfterConversionBringsTheCheckBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, schema := outboxtest.Schema(t)
	ct := &checkTimes{}
	pcfg := base.Config()
	pcfg.ConnConfig.Tracer = ct
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var published atomic.Int64
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		published.Add(int64(len(msgs)))
		return nil
	})
	cfg := quietConfig(schema, pub)
	cfg.DisableNotify, cfg.IdleBackoffMax = true, 16*time.Second
	r, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	outbox.SetPartitionCheckEvery(r, 200*time.Millisecond)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(30 * time.Second)
	for {
		ts := ct.snapshot()
		if n := len(ts); n >= 2 && ts[n-1].Sub(ts[n-2]) >= 3500*time.Millisecond && time.Since(ts[n-1]) < 500*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stretched check")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := outboxmigrate.Partition(ctx, base, schema, outboxmigrate.PartitionConfig{Interval: time.Second, Ahead: 4}); err != nil {
		t.Fatal(err)
	}
	converted := time.Now()
	before := len(ct.snapshot())
	w := newWriter(t, schema)
	if err := advWriteOne(ctx, base, w); err != nil {
		t.Fatal(err)
	}
	r.Wake()
	outboxtest.Eventually(t, 5*time.Second, "the event published", func() bool { return published.Load() > 0 })
	outboxtest.Eventually(t, 3*time.Second, "a check soon after the claim", func() bool { return len(ct.snapshot()) > before })
	outboxtest.Eventually(t, 30*time.Second, "past the conversion's partitions", func() bool {
		return time.Since(converted) > 9*time.Second
	})
	if err := advWriteOne(ctx, base, w); err != nil {
		t.Fatalf("a write %s after the conversion, the first claim having ended the idle spell: %v", time.Since(converted).Round(time.Millisecond), err)
	}
}
