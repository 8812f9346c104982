package outbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

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
	nothing := outbox.PublisherFunc(func(context.Context, []outbox.Message) []error { return nil })
	_, checks := idleRelay(t, base, schema, nothing, 2*time.Second, 200*time.Millisecond)
	outboxtest.Eventually(t, 20*time.Second, "a second without a check while idle", func() bool {
		return checks.quietFor(time.Second)
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
	var published atomic.Int64
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		published.Add(int64(len(msgs)))
		return nil
	})
	r, ct := idleRelay(t, base, schema, pub, 16*time.Second, 200*time.Millisecond)
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
