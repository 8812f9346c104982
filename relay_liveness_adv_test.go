package outbox_test

// The incremental claim's liveness against a backlog of heads and a lane
// that cannot be parked: tests written by an adversarial review (stop 32),
// each failing on the code it reviewed; see each comment for the defect.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestLivenessLanesBeyondTheContCapHandedOver: the lanes an incremental
// claim looks for again were capped at four windows and the rest dropped;
// they are now handed over to the scheduled events (made due). docs/design.md
// ("Why nothing is left behind") says a lane's next event k, passed by the
// range scan as not its lane's head, is looked for (cont) "for as many
// claims as it takes while it is left for lack of room ... until it is
// claimed, leased or published". The cap cuts cont to 4 × claimWindow
// entries, dropping the newest: their events were passed by the cursor, are
// as written (not in the rescheduled index), and nothing but the full scan
// finds them again.
//
// Shape: a backlog of scheduled heads (retried / released events, due long
// ago) that sort before every fresh event; 100 lanes whose head is among
// them and whose next event is written as usual. BatchSize 10 makes the
// window 16 and the cap 64: each claim publishes 10 heads and adds their
// lanes to cont, the cont events sort after the scheduled backlog and are
// left for lack of room, and once more than 64 are kept the rest are
// dropped. With RescanInterval an hour those events are never published.
func TestLivenessLanesBeyondTheContCapHandedOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := freshOnly(schema, b.pub)
	cfg.BatchSize = 10
	cfg.PollInterval, cfg.DisableNotify, cfg.DisableClaimAhead = time.Hour, true, true
	gate := newClaimGate()
	cfg.Observer = gate
	r, stop := startRelay(t, pool, cfg)
	defer stop()
	writeEventsFor(t, pool, w, "warm-up")
	r.Wake()
	outboxtest.Eventually(t, livenessWait, "warm-up event published", func() bool { return countUnpublished(t, pool, schema) == 0 })
	// Hold the relay's loop in its next claim's observation while the
	// events are written, so that no claim sees half of them.
	release := gate.hold(r)
	defer release()
	// write writes one event of aggregate id, scheduled due ago before its
	// occurred_at when ago > 0 (as a retried or released event is).
	write := func(id string, ago time.Duration) {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := w.InsertTx(ctx, tx, orderEvent(id, "Tick")); err != nil {
				return err
			}
			if ago == 0 {
				return nil
			}
			_, err := tx.Exec(ctx, `UPDATE `+schema+`.outbox_events SET available_at = occurred_at - $2 * interval '1 millisecond'
				WHERE aggregate_id = $1 AND published_at IS NULL`, id, ago.Milliseconds())
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	const lanes, backlog = 100, 150
	var contLanes []string
	for i := range lanes {
		id := fmt.Sprintf("c-%03d", i)
		contLanes = append(contLanes, id)
		write(id, 2*time.Hour) // the lane's head: scheduled, due first
	}
	for j := range backlog {
		write(fmt.Sprintf("s-%03d", j), time.Hour) // other scheduled heads, due before any fresh event
	}
	for _, id := range contLanes {
		write(id, 0) // the lane's next event, as written: read by the range scan while its head is pending
	}
	release()
	r.Wake()
	deadline := time.Now().Add(livenessWait)
	for countUnpublished(t, pool, schema) > 0 {
		if time.Now().After(deadline) {
			var left []string
			rows, err := pool.Query(ctx, `SELECT aggregate_id || '#' || aggregate_sequence FROM `+schema+`.outbox_events
				WHERE published_at IS NULL ORDER BY 1`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var s string
				_ = rows.Scan(&s)
				left = append(left, s)
			}
			rows.Close()
			t.Fatalf("%d committed, due events not published after %s without the full scan (an hour away): %v",
				len(left), livenessWait, left)
		}
		r.Wake()
		time.Sleep(20 * time.Millisecond)
	}
}

// claimGate is a ClaimObserver that can hold the relay's loop in the
// observation of one claim (the loop calls observers synchronously): a test
// writes a state that no claim may see half of meanwhile.
type claimGate struct {
	mu      sync.Mutex
	armed   bool
	held    chan struct{}
	release chan struct{}
}

func newClaimGate() *claimGate { return &claimGate{} }

func (g *claimGate) ObserveClaim(outbox.ClaimObservation) {
	g.mu.Lock()
	if !g.armed {
		g.mu.Unlock()
		return
	}
	g.armed = false
	held, release := g.held, g.release
	g.mu.Unlock()
	close(held)
	<-release
}

// hold waits until the relay's loop is held in a claim's observation (r is
// woken so that a claim comes), and returns the function that lets it go.
func (g *claimGate) hold(r *outbox.Relay) func() {
	g.mu.Lock()
	g.armed, g.held, g.release = true, make(chan struct{}), make(chan struct{})
	held, release := g.held, g.release
	g.mu.Unlock()
	r.Wake()
	select {
	case <-held:
	case <-time.After(livenessWait):
		panic("the relay made no claim after a wake-up")
	}
	var once sync.Once
	return func() { once.Do(func() { close(release) }) }
}

// TestLivenessBulkWriteBehindUnparkedQuarantine: one transaction wrote more
// events of one aggregate than the incremental claim's window, and the
// first of them is quarantined while nothing parks the lane (a writer's
// open transaction held its counter row when the relay quarantined it; here
// the quarantine is set by hand and the lane sweep is an hour away). The
// range scan's window was then all events of that one transaction, none a
// head; the cursor, a transaction id, could not move past a transaction it
// had not read to its end, and every event written after it waited for the
// full scan (found by the stop-32 review). The cursor now keeps its place
// inside a transaction.
func TestLivenessBulkWriteBehindUnparkedQuarantine(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := freshOnly(schema, b.pub)
	cfg.BatchSize = 4 // a window of 16
	cfg.LaneSweepInterval = time.Hour
	r, stop := startRelay(t, pool, cfg)
	defer stop()
	warmUp(t, pool, w, schema)
	writeQuarantinedByHand(t, pool, w, schema, "bulk", 40)
	writeEventsFor(t, pool, w, "after-1", "after-2")
	r.Wake()
	publishedSoon(t, pool, schema, "events written after a bulk write behind a quarantined head", "after-1", "after-2")
	if n := countUnpublished(t, pool, schema); n != 40 {
		t.Fatalf("%d events unpublished, want the 40 of the blocked lane", n)
	}
}

// TestLivenessContLockedByALongClaim: a lane's next event k+1, passed by
// the range scans while k was in flight (not a head then), is looked for by
// key after k's publish (cont). A statement that holds k+1 locked for
// several claims in a row (another relay's full scan under a pinned xmin
// takes seconds and locks its whole window; here a transaction holds the
// row) made the look count as three tries, and k+1 was dropped: nothing but
// the full scan would find it, a minute and more later under a pinned xmin
// (the pressure bench's 34 s and 68 s events, and its events never
// delivered). It is now handed over (made due) once the lock is gone.
func TestLivenessContLockedByALongClaim(t *testing.T) {
	t.Parallel()
	l := startLockedLane(t, 6, func(*outbox.RelayConfig) {}, func(*outbox.RelayConfig) {})
	if err := l.lock.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.a.Wake()
	l.b.Wake()
	publishedSoon(t, l.pool, l.schema, "k+1, once its lock is gone", "lane")
}

// lockedLane is the shape of the hand-over tests: k of aggregate "lane" in
// flight at relay A (its publish held), k+1 written meanwhile and passed by
// relay B's cursor as not a head (B published "other", written after it),
// then k+1 held locked by another transaction (lock) while A publishes k
// and makes at least looks claims (each looks k+1 up, finds it locked).
type lockedLane struct {
	pool   *pgxpool.Pool
	schema string
	a, b   *outbox.Relay
	stopA  func()
	lock   pgx.Tx
}

// startLockedLane sets up a lockedLane; tuneA and tuneB adjust the relays'
// configurations. Everything stops and is rolled back at the test's end.
func startLockedLane(t *testing.T, looks int, tuneA, tuneB func(*outbox.RelayConfig)) *lockedLane {
	t.Helper()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	nats := newNATS(t, outboxtest.NATSURL(), 0)
	inGate, openGate := make(chan struct{}), make(chan struct{})
	var entered, opened sync.Once
	open := func() { opened.Do(func() { close(openGate) }) }
	gated := failingPublisher{next: nats.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "lane" && m.Sequence == 1 {
			entered.Do(func() { close(inGate) })
			<-openGate
		}
		return nil
	}}
	cfgA := freshOnly(schema, gated)
	cfgA.ID = "relay-a"
	claims := &claimCounter{}
	cfgA.Observer = claims
	tuneA(&cfgA)
	l := &lockedLane{pool: pool, schema: schema}
	l.a, l.stopA = startRelay(t, pool, cfgA)
	t.Cleanup(open) // registered after A's stop, so it runs before it: A is never left held
	warmUp(t, pool, w, schema)
	writeEventsFor(t, pool, w, "lane")
	l.a.Wake()
	<-inGate // k is in flight at relay A
	cfgB := freshOnly(schema, nats.pub)
	cfgB.ID = "relay-b"
	tuneB(&cfgB)
	l.b, _ = startRelay(t, pool, cfgB)
	writeEventsFor(t, pool, w, "lane") // k+1, not a head while k is in flight
	writeEventsFor(t, pool, w, "other")
	l.b.Wake()
	// Relay B's claims read k+1 (not a head) and published the other
	// aggregate's event written after it: B's cursor passed k+1.
	publishedSoon(t, pool, schema, "the other aggregate's event, by relay B", "other")
	// A long statement holds k+1, as a full scan under a pinned xmin does.
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Rollback(context.Background()) })
	if _, err := lock.Exec(ctx, `SELECT 1 FROM `+schema+`.outbox_events WHERE aggregate_id = 'lane' AND aggregate_sequence = 2 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	l.lock = lock
	seen := claims.n.Load()
	open() // A publishes k and looks for k+1 at its next claims
	outboxtest.Eventually(t, livenessWait, "claims of relay A while k+1 is locked", func() bool {
		l.a.Wake()
		return claims.n.Load() >= seen+int64(looks)
	})
	if n := countUnpublished(t, pool, schema); n != 1 {
		t.Fatalf("%d events unpublished, want k+1 alone", n)
	}
	return l
}
