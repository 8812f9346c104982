package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestHotLanesDrainInOrder: a few aggregates with many events each. The
// claim takes each lane's contiguous successors, so batches are full, and
// the stream still sees every aggregate in sequence order (I5), with
// several relays competing for the lanes.
func TestHotLanesDrainInOrder(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	writeEvents(t, pool, w, 3, 60) // 3 lanes of 60 events
	var relays []*outbox.Relay
	for i := 0; i < 2; i++ {
		cfg := quietConfig(schema, b.pub)
		cfg.BatchSize = 50
		cfg.ID = fmt.Sprintf("hot-%d", i)
		r, _ := startRelay(t, pool, cfg)
		relays = append(relays, r)
	}
	outboxtest.Eventually(t, 30*time.Second, "all published", func() bool { return unpublished(t, pool, schema) == 0 })
	seen := checkBrokerOrder(t, b.streamEvents(t))
	if len(seen) != 180 {
		t.Fatalf("%d events at the broker, want 180", len(seen))
	}
	claimed := relays[0].Stats().Claimed + relays[1].Stats().Claimed
	if claimed > 180+50 { // a few re-claims are fine; head-only claims would need 60 rounds of 3
		t.Fatalf("claimed %d events for 180", claimed)
	}
}

// TestBlockedLaneDoesNotStarveOthers: the oldest pending events all belong
// to one aggregate whose head is quarantined, more of them than the claim's
// window; the other aggregates' events behind them are still published.
func TestBlockedLaneDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "poison" {
			return outbox.Permanent(errors.New("refused"))
		}
		return nil
	}}
	// 40 events of the poisoned aggregate first, then 12 other aggregates.
	for i := 0; i < 40; i++ {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.InsertTx(ctx, tx, orderEvent("poison", fmt.Sprintf("P%d", i)))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 12; i++ {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.InsertTx(ctx, tx, orderEvent(fmt.Sprintf("ok-%d", i), "O"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := quietConfig(schema, pub)
	cfg.BatchSize = 4 // window of 8: all poisoned rows at first
	startRelay(t, pool, cfg)
	outboxtest.Eventually(t, 30*time.Second, "other aggregates published past the blocked lane", func() bool {
		return unpublished(t, pool, schema) == 40
	})
	var quarantined, leased int
	if err := pool.QueryRow(ctx, `SELECT count(quarantined_at), count(claim_token) FROM `+schema+`.outbox_events
		WHERE aggregate_id = 'poison'`).Scan(&quarantined, &leased); err != nil {
		t.Fatal(err)
	}
	if quarantined != 1 || leased != 0 {
		t.Fatalf("%d poisoned events quarantined and %d leased, want the head only and none", quarantined, leased)
	}
	checkBrokerOrder(t, b.streamEvents(t))
}

// TestHeadersReachTheBroker: an event's headers (the W3C trace context)
// travel from the writer through the claim to the broker; an event without
// headers carries none.
func TestHeadersReachTheBroker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traced := orderEvent("traced", "T")
	traced.Headers = map[string]string{"traceparent": tp, "tracestate": "a=1"}
	for _, ev := range []outbox.Event{traced, orderEvent("plain", "P")} {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.InsertTx(ctx, tx, ev)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	startRelay(t, pool, quietConfig(schema, b.pub))
	outboxtest.Eventually(t, 30*time.Second, "published", func() bool { return unpublished(t, pool, schema) == 0 })
	for _, m := range b.streamEvents(t) {
		switch m.AggregateID {
		case "traced":
			if m.Headers["traceparent"] != tp || m.Headers["tracestate"] != "a=1" {
				t.Fatalf("traced event's headers at the broker: %v", m.Headers)
			}
		case "plain":
			if len(m.Headers) != 0 {
				t.Fatalf("plain event's headers at the broker: %v", m.Headers)
			}
		}
	}
}

// TestClaimAheadReleasedOnShutdown: while a backlog drains, each batch is
// published while the next one is claimed; a relay stopped mid-drain
// releases the batch it claimed ahead, so nothing stays leased, and what was
// published is in order.
func TestClaimAheadReleasedOnShutdown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	writeEvents(t, pool, w, 200, 3) // 200 lanes of 3 events
	// Once 100 events are out, a publish waits until the relay has claimed
	// the next batch ahead of it (more claimed than this publisher has been
	// given, this batch included), and only then lets the test stop the
	// relay.
	var relay atomic.Pointer[outbox.Relay]
	var published atomic.Int64
	ahead := make(chan struct{})
	var once sync.Once
	slow := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		if published.Load() >= 100 {
			for r := relay.Load(); r != nil && ctx.Err() == nil; time.Sleep(5 * time.Millisecond) {
				if r.Stats().Claimed > published.Load()+int64(len(msgs)) {
					once.Do(func() { close(ahead) })
					break
				}
			}
		}
		errs := b.pub.Publish(ctx, msgs)
		published.Add(int64(len(msgs)))
		return errs
	})
	cfg := quietConfig(schema, slow)
	cfg.BatchSize = 20
	cfg.LeaseDuration = time.Hour
	r, stop := startRelay(t, pool, cfg)
	relay.Store(r)
	select {
	case <-ahead:
	case <-time.After(60 * time.Second):
		t.Fatalf("stats %+v: no batch was claimed ahead of a publish within a minute", r.Stats())
	}
	stop()
	var leased int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox_events WHERE claim_token IS NOT NULL").Scan(&leased); err != nil {
		t.Fatal(err)
	}
	if leased != 0 {
		t.Fatalf("%d events still leased after shutdown", leased)
	}
	st := r.Stats()
	if st.Claimed <= st.Published {
		t.Fatalf("stats %+v: the relay never had a batch claimed ahead when it stopped", st)
	}
	checkBrokerOrder(t, b.streamEvents(t))
	// Another relay finishes the job, in order.
	startRelay(t, pool, quietConfig(schema, b.pub))
	outboxtest.Eventually(t, 30*time.Second, "all published", func() bool { return unpublished(t, pool, schema) == 0 })
	if seen := checkBrokerOrder(t, b.streamEvents(t)); len(seen) != 600 {
		t.Fatalf("%d events at the broker, want 600", len(seen))
	}
}
