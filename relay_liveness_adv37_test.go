package outbox_test

// Findings of the adversarial review of the lanes set aside ahead of the
// cursor (claimCursor.ahead; docs/design.md, "Why nothing is left behind").

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

// writeBulkFor writes n events of aggregate id in one transaction.
func writeBulkFor(t *testing.T, pool pgxBeginner, w *outbox.Writer, id string, n int) {
	t.Helper()
	ctx := context.Background()
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = orderEvent(id, "Tick")
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.InsertTx(ctx, tx, evs...); return err }); err != nil {
		t.Fatal(err)
	}
}

type pgxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// TestLivenessAdv37SetAsideBehindALaggingCursor: relay A holds k = lane#1
// in flight while relay B's cursor runs ahead of A's: B reads k+1 (not a
// head then) and passes it, past a block of events of a lane behind a head
// that backs off (not heads either, more than a window of them). A
// publishes k and looks for k+1 (cont): k+1 lies ahead of A's cursor, so A
// sets the lane aside until its own range scan gets there. But A's cursor
// is behind the whole block, which it crosses a window per claim, and a
// claim that claims nothing is followed by PollInterval of idling: k+1
// waits for A to crawl the block, two minutes at the default PollInterval,
// while nobody else will read it (B has passed it). Before the lanes were
// set aside, A's next claim probed k+1 by key and claimed it at once.
func TestLivenessAdv37SetAsideBehindALaggingCursor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	inGate, openGate := make(chan struct{}), make(chan struct{})
	gated := outbox.Publisher(failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		switch {
		case m.AggregateID == "busy" && m.Sequence == 1:
			return errors.New("try again in an hour")
		case m.AggregateID == "lane" && m.Sequence == 1:
			close(inGate)
			<-openGate
		}
		return nil
	}})
	cfgA := freshOnly(schema, gated)
	cfgA.ID = "relay-a"
	cfgA.PollInterval = outbox.PollIntervalDefault
	cfgA.BatchSize = 4 // a window of 16
	cfgA.RetryBackoffMin, cfgA.RetryBackoffMax = time.Hour, time.Hour
	_, stopA := startRelay(t, pool, cfgA)
	defer stopA()
	warmUp(t, pool, w, schema)
	writeEventsFor(t, pool, w, "busy")
	outboxtest.Eventually(t, livenessWait, "the busy aggregate's head failed once", func() bool {
		var attempts int
		if err := pool.QueryRow(ctx, `SELECT attempt_count FROM `+schema+`.outbox_events WHERE aggregate_id = 'busy'`).Scan(&attempts); err != nil {
			t.Fatal(err)
		}
		return attempts == 1
	})
	writeEventsFor(t, pool, w, "lane")
	<-inGate // A publishes k, blocked; its cursor stays where its claim of k left it

	cfgB := freshOnly(schema, failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "busy" && m.Sequence == 1 {
			return errors.New("try again in an hour")
		}
		return nil
	}})
	cfgB.ID = "relay-b"
	cfgB.BatchSize = 4
	cfgB.RetryBackoffMin, cfgB.RetryBackoffMax = time.Hour, time.Hour
	_, stopB := startRelay(t, pool, cfgB)
	defer stopB()

	const block = 2000 // 125 windows of 16
	writeBulkFor(t, pool, w, "busy", block)
	writeEventsFor(t, pool, w, "lane") // k+1, committed while k is in flight at A
	writeEventsFor(t, pool, w, "after")
	// B's cursor crosses the block and k+1 (not heads) and claims "after".
	publishedSoon(t, pool, schema, "an event after the block and k+1, by relay-b", "after")

	close(openGate) // A marks k, and looks for k+1
	start := time.Now()
	publishedSoon(t, pool, schema, fmt.Sprintf("k+1, once relay-a published k (its cursor %d events behind it)", block), "lane")
	t.Logf("k+1 published %s after k's publish was let go", time.Since(start).Round(time.Millisecond))
}

// TestLivenessAdv37OneRelayCrossesABlockAtPollPace: one relay, a lane
// whose head backs off with more than a window of events behind it (a bulk
// write of one aggregate: none of them a head), then an event of another
// aggregate. The range scan crosses the block a window per claim, and a
// claim that claims nothing is followed by PollInterval of idling: at the
// default PollInterval the event after the block waited for 125 claims, two
// minutes, though every one of those claims found more to read.
func TestLivenessAdv37OneRelayCrossesABlockAtPollPace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := freshOnly(schema, failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "busy" && m.Sequence == 1 {
			return errors.New("try again in an hour")
		}
		return nil
	}})
	cfg.PollInterval = outbox.PollIntervalDefault
	cfg.BatchSize = 4 // a window of 16
	cfg.RetryBackoffMin, cfg.RetryBackoffMax = time.Hour, time.Hour
	_, stop := startRelay(t, pool, cfg)
	defer stop()
	warmUp(t, pool, w, schema)
	writeEventsFor(t, pool, w, "busy")
	outboxtest.Eventually(t, livenessWait, "the busy aggregate's head failed once", func() bool {
		var attempts int
		if err := pool.QueryRow(ctx, `SELECT attempt_count FROM `+schema+`.outbox_events WHERE aggregate_id = 'busy'`).Scan(&attempts); err != nil {
			t.Fatal(err)
		}
		return attempts == 1
	})
	const block = 2000 // 125 windows of 16
	writeBulkFor(t, pool, w, "busy", block)
	writeEventsFor(t, pool, w, "after")
	start := time.Now()
	publishedSoon(t, pool, schema, fmt.Sprintf("an event written after a block of %d events that are not heads", block), "after")
	t.Logf("published %s after it was written", time.Since(start).Round(time.Millisecond))
}

// holdAfter holds the relay it observes in its claim after the armed one,
// until released: the relay's state is then that claim's.
type holdAfter struct {
	armed    atomic.Bool
	held     chan struct{}
	released chan struct{}
	once     sync.Once
}

func (h *holdAfter) ObserveClaim(outbox.ClaimObservation) {
	if h.armed.Load() {
		h.once.Do(func() { close(h.held); <-h.released })
	}
}

// TestLivenessAdv37StopWithALaneSetAside: relay A publishes k and sets
// k+1 aside (it lies past a block of more than a window of events that are
// not heads, ahead of A's cursor), while relay B's cursor has passed k+1
// (not a head while k was in flight). A stops right after that claim: its
// last write must hand the lane set aside over, as it does the lanes it
// still looks for by key, else nobody reads k+1 before the full scan.
// (TestLivenessStoppedRelayHandsItsLanesOver stops its relay before any
// claim sets the lane aside.)
func TestLivenessAdv37StopWithALaneSetAside(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	inGate, openGate := make(chan struct{}), make(chan struct{})
	hold := &holdAfter{held: make(chan struct{}), released: make(chan struct{})}
	var released sync.Once
	release := func() { released.Do(func() { close(hold.released) }) }
	busyFails := func(m outbox.Message) error {
		if m.AggregateID == "busy" && m.Sequence == 1 {
			return errors.New("try again in an hour")
		}
		return nil
	}
	cfgA := freshOnly(schema, failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "lane" && m.Sequence == 1 {
			close(inGate)
			<-openGate
		}
		return busyFails(m)
	}})
	cfgA.ID = "relay-a"
	cfgA.BatchSize = 4 // a window of 16
	cfgA.Observer = hold
	cfgA.RetryBackoffMin, cfgA.RetryBackoffMax = time.Hour, time.Hour
	_, stopA := startRelay(t, pool, cfgA)
	t.Cleanup(release) // registered after A's stop, so it runs before it
	warmUp(t, pool, w, schema)
	writeEventsFor(t, pool, w, "busy")
	outboxtest.Eventually(t, livenessWait, "the busy aggregate's head failed once", func() bool {
		var attempts int
		if err := pool.QueryRow(ctx, `SELECT attempt_count FROM `+schema+`.outbox_events WHERE aggregate_id = 'busy'`).Scan(&attempts); err != nil {
			t.Fatal(err)
		}
		return attempts == 1
	})
	writeEventsFor(t, pool, w, "lane")
	<-inGate // A publishes k, blocked
	cfgB := freshOnly(schema, failingPublisher{next: b.pub, fail: busyFails})
	cfgB.ID = "relay-b"
	cfgB.BatchSize = 4
	cfgB.RetryBackoffMin, cfgB.RetryBackoffMax = time.Hour, time.Hour
	_, stopB := startRelay(t, pool, cfgB)
	defer stopB()
	writeBulkFor(t, pool, w, "busy", 40) // more than a window: A's next claim does not reach k+1
	writeEventsFor(t, pool, w, "lane")   // k+1
	writeEventsFor(t, pool, w, "after")
	publishedSoon(t, pool, schema, "an event after the block and k+1, by relay-b", "after")
	hold.armed.Store(true)
	close(openGate) // A marks k; its next claim sets k+1 aside, and A is held there
	<-hold.held
	var pending bool
	if err := pool.QueryRow(ctx, `SELECT published_at IS NULL FROM `+schema+`.outbox_events
		WHERE aggregate_id = 'lane' AND aggregate_sequence = 2`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if !pending {
		t.Fatal("k+1 was published before A stopped (the test's premise)")
	}
	stopped := make(chan struct{})
	go func() { defer close(stopped); stopA() }()
	release()
	<-stopped
	writeEventsFor(t, pool, w, "poke") // B's claims keep coming
	publishedSoon(t, pool, schema, "k+1, set aside by relay-a when it stopped; relay-b is alive", "lane", "poke")
}
