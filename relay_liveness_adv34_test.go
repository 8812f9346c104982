package outbox_test

// Tests written by the adv34 adversarial review of the position cursor,
// the two-statement background full scan and the hand-over by key; each
// fails on the code it reviewed (see each comment for the defect).

import (
	"context"
	"fmt"
	"hash/crc32"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// holdingPublisher holds every publish of an event whose aggregate id
// starts with prefix until its context ends, and passes the rest on.
type holdingPublisher struct {
	next    outbox.Publisher
	prefix  string
	entered chan struct{}
	once    *sync.Once
}

func (p holdingPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	for _, m := range msgs {
		if strings.HasPrefix(m.AggregateID, p.prefix) {
			p.once.Do(func() { close(p.entered) })
			<-ctx.Done()
			errs := make([]error, len(msgs))
			for i := range errs {
				errs[i] = ctx.Err()
			}
			return errs
		}
	}
	return p.next.Publish(ctx, msgs)
}

// TestLivenessAdv34StoppedRelayLeavesTheHeadsItHadNoRoomFor: docs/design.md
// ("Why nothing is left behind") lets a cursor pass a head it read while
// "locked by another statement: a claim (which claims it, or ... keeps its
// own cursor behind it when it had no room for it)". That claim's cursor
// lives in its relay's memory, and a relay that stops hands over only the
// lanes it was to continue (cont, over), not the heads its cursor was
// holding. Shape: relay X (batch 1, a window of 16) claims one of 20 fresh
// heads and keeps its cursor before the 15 others of its window, which its
// statement holds locked (a trigger stands for a slow claim statement: the
// pressure bench saw incremental claims of seconds under a pinned xmin);
// relay Y's claim meanwhile skips those 15, claims the other 4, and its
// cursor moves past all 20. X stops (its one event is released, due). The
// 15 are pending, as written, behind Y's cursor, in nobody's cont: only the
// full scan (an hour away) finds them.
func TestLivenessAdv34StoppedRelayLeavesTheHeadsItHadNoRoomFor(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	held := holdingPublisher{next: b.pub, prefix: "h-", entered: make(chan struct{}), once: &sync.Once{}}

	cfgX := freshOnly(schema, held)
	cfgX.ID, cfgX.BatchSize = "relay-x", 1
	cfgX.DisableNotify, cfgX.DisableClaimAhead, cfgX.PollInterval = true, true, time.Hour
	cfgX.ShutdownTimeout = 100 * time.Millisecond
	claimsX, claimsY := &claimCounter{}, &claimCounter{}
	cfgX.Observer = claimsX
	x, stopX := startRelay(t, pool, cfgX)
	cfgY := freshOnly(schema, b.pub)
	cfgY.ID, cfgY.BatchSize = "relay-y", 100
	cfgY.DisableNotify, cfgY.PollInterval = true, time.Hour
	cfgY.Observer = claimsY
	y, stopY := startRelay(t, pool, cfgY)
	defer stopY()

	// Both relays past their first claim (a full scan, of nothing), then
	// each publishes an event with an incremental claim: cursors set.
	outboxtest.Eventually(t, livenessWait, "both relays' first claims", func() bool {
		return claimsX.n.Load() > 0 && claimsY.n.Load() > 0
	})
	writeEventsFor(t, pool, w, "warm-x")
	outboxtest.Eventually(t, livenessWait, "warm-up by X", func() bool { x.Wake(); return countUnpublished(t, pool, schema) == 0 })
	writeEventsFor(t, pool, w, "warm-y")
	outboxtest.Eventually(t, livenessWait, "warm-up by Y", func() bool { y.Wake(); return countUnpublished(t, pool, schema) == 0 })

	// X's claims wait, inside their UPDATE, for an advisory lock the test
	// holds: the rows their statement locked stay locked meanwhile.
	unlock := slowClaims(t, pool, schema, "relay-x")
	defer unlock()

	ids := make([]string, 20)
	for i := range ids {
		ids[i] = fmt.Sprintf("h-%02d", i)
	}
	writeEventsFor(t, pool, w, ids...)
	x.Wake()
	claimWaiting(t, pool, schema)
	// Y claims what X's statement has not locked, and its cursor moves past
	// the rest (its window is not full, every head it found it claimed).
	y.Wake()
	outboxtest.Eventually(t, livenessWait, "Y publishes the 4 heads X's window left out", func() bool {
		return countUnpublished(t, pool, schema) == 16
	})
	unlock()
	select { // X claimed one head, its cursor before the 15 others
	case <-held.entered:
	case <-time.After(livenessWait):
		t.Fatal("X published nothing after its claim")
	}
	stopX()
	wakeUntilPublished(t, pool, schema, y, "fresh heads a stopped relay's cursor was holding, passed by the other relay while its claim held them", ids...)
}

// slowClaims makes the claims of the relay named id wait, inside their
// UPDATE (a trigger), for an advisory lock held until the returned function
// is called: a claim statement that takes long (the pressure bench saw
// claims of seconds under a pinned xmin), holding the rows it locked.
func slowClaims(t *testing.T, pool *pgxpool.Pool, schema, id string) (release func()) {
	t.Helper()
	ctx := context.Background()
	key := int64(crc32.ChecksumIEEE([]byte(schema)))
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION %[1]s.adv34_slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_advisory_xact_lock_shared(%[2]d); RETURN NEW; END $$;
CREATE TRIGGER adv34_slow_claim BEFORE UPDATE ON %[1]s.outbox_events FOR EACH ROW
WHEN (NEW.claimed_by = %[3]s AND OLD.claimed_by IS DISTINCT FROM NEW.claimed_by)
EXECUTE FUNCTION %[1]s.adv34_slow_claim()`, schema, key, pgQuote(id))); err != nil {
		t.Fatal(err)
	}
	gate, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gate.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		gate.Release()
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			defer gate.Release()
			if _, err := gate.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

func pgQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// claimWaiting waits until a claim of schema waits in slowClaims's trigger.
func claimWaiting(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	outboxtest.Eventually(t, livenessWait, "a claim waiting in its UPDATE", func() bool {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event = 'advisory' AND position($1 in query) > 0`, schema).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
}

// claimWaitingUnlessTaken is claimWaiting that gives up, returning false,
// when the relay named other has claimed one of the events of ids instead
// (or published it).
func claimWaitingUnlessTaken(t *testing.T, pool *pgxpool.Pool, schema, other string, ids []string) bool {
	t.Helper()
	waiting := false
	outboxtest.Eventually(t, livenessWait, "a claim waiting in its UPDATE, or the other relay's claim", func() bool {
		var n, taken int
		if err := pool.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' AND position($1 in query) > 0),
			(SELECT count(*) FROM `+schema+`.outbox_events WHERE aggregate_id = ANY($2)
				AND (claimed_by = $3 OR published_at IS NOT NULL))`, schema, ids, other).Scan(&n, &taken); err != nil {
			t.Fatal(err)
		}
		waiting = n > 0
		return n > 0 || taken > 0
	})
	return waiting
}

// wakeUntilPublished is publishedSoon for a relay that neither polls nor
// listens: it is woken while the test waits.
func wakeUntilPublished(t *testing.T, pool *pgxpool.Pool, schema string, r *outbox.Relay, what string, ids ...string) {
	t.Helper()
	deadline := time.Now().Add(livenessWait)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+schema+`.outbox_events
			WHERE published_at IS NULL AND aggregate_id = ANY($1)`, ids).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			dumpPending(t, pool, schema)
			t.Fatalf("%s: %d events of %v still unpublished after %s (the full scan is an hour away)", what, n, ids, livenessWait)
		}
		r.Wake()
		time.Sleep(20 * time.Millisecond)
	}
}

// gatedPublisher holds the publish of aggregate id's first event until
// open is closed, and passes everything on.
type gatedPublisher struct {
	next    outbox.Publisher
	id      string
	entered chan struct{}
	open    chan struct{}
	once    *sync.Once
}

func (p gatedPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	for _, m := range msgs {
		if m.AggregateID == p.id && m.Sequence == 1 {
			p.once.Do(func() { close(p.entered) })
			<-p.open
		}
	}
	return p.next.Publish(ctx, msgs)
}

// TestSafetyNetAdv34DoesNotLockYoungContinuations: RelayConfig.ReconcileAfter
// says a safety net "never locks a row younger than ReconcileAfter, even for
// the claim's statement", so that the CDC stream's claim (SKIP LOCKED) does
// not skip it (issue 27). The incremental claim filters its fresh, points
// and due rows by age before locking them, but not cont: after the net
// publishes an old head k, its next claim looks k+1 up by key and locks it,
// young as it is (and leaves it: it is not old enough to be claimed).
func TestSafetyNetAdv34DoesNotLockYoungContinuations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	gate := gatedPublisher{next: b.pub, id: "lane", entered: make(chan struct{}), open: make(chan struct{}), once: &sync.Once{}}
	defer func() {
		select {
		case <-gate.open:
		default:
			close(gate.open)
		}
	}()
	// k, old: written two hours ago, as written.
	writeEventsFor(t, pool, w, "lane")
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET occurred_at = occurred_at - interval '2 hours',
		available_at = occurred_at - interval '2 hours' WHERE aggregate_id = 'lane'`); err != nil {
		t.Fatal(err)
	}
	cfg := freshOnly(schema, gate)
	cfg.ReconcileAfter = time.Hour
	claims := &claimCounter{}
	cfg.Observer = claims
	_, stop := startRelay(t, pool, cfg)
	defer stop()
	select { // the net claims k (its first claim) and publishes it
	case <-gate.entered:
	case <-time.After(livenessWait):
		t.Fatal("the safety net did not claim the old event")
	}
	writeEventsFor(t, pool, w, "lane") // k+1, young
	seen := claims.n.Load()
	close(gate.open)
	// After k's publish the net claims again at once (CatchUpInterval),
	// and then idles for ReconcileAfter/4.
	outboxtest.Eventually(t, livenessWait, "k published and the net's next claim made", func() bool {
		var published bool
		if err := pool.QueryRow(ctx, `SELECT published_at IS NOT NULL FROM `+schema+`.outbox_events
			WHERE aggregate_id = 'lane' AND aggregate_sequence = 1`).Scan(&published); err != nil {
			t.Fatal(err)
		}
		return published && claims.n.Load() >= seen+1
	})
	var xmax string
	if err := pool.QueryRow(ctx, `SELECT xmax::text FROM `+schema+`.outbox_events
		WHERE aggregate_id = 'lane' AND aggregate_sequence = 2`).Scan(&xmax); err != nil {
		t.Fatal(err)
	}
	if xmax != "0" {
		t.Fatalf("the young event k+1 was locked by the safety net's claim (xmax %s): the CDC stream's claim skips it meanwhile", xmax)
	}
}

// TestLivenessAdv34StopDuringAClaimLeavesItsRowsLeased: Run's doc says a
// stopping relay "releases the rest", and the background full scan's batch
// is released by its claim token when its statement was cancelled after it
// committed (dropFullScan). The main loop's claim runs under Run's context:
// a stop while its statement is in flight makes pgx give the connection up
// (a deadline) and send a cancel request on a new connection; when the
// statement ends before that request lands, it commits, and its rows stay
// leased to the stopped relay for the whole lease. The other relay's
// incremental claims read them while leased and pass them; once the lease
// has expired only a full scan (an hour away here) takes them over. Here the
// claim's statement is held in its UPDATE, and the cancel request's
// connection is held until the statement has committed.
func TestLivenessAdv34StopDuringAClaimLeavesItsRowsLeased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	// X's pool: new connections (the cancel request's among them) wait
	// while the dial gate is closed.
	var gateMu sync.Mutex
	gateOpen := make(chan struct{})
	close(gateOpen)
	pc, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		gateMu.Lock()
		g := gateOpen
		gateMu.Unlock()
		select {
		case <-g:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	poolX, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(poolX.Close)

	cfgX := freshOnly(schema, b.pub)
	cfgX.ID, cfgX.DisableNotify, cfgX.PollInterval = "relay-x", true, time.Hour
	cfgX.LeaseDuration = 5 * time.Second // expires well within the wait
	claimsX, claimsY := &claimErrors{}, &claimCounter{}
	cfgX.Observer = claimsX
	x, stopX := startRelay(t, poolX, cfgX)
	cfgY := freshOnly(schema, b.pub)
	cfgY.ID = "relay-y"
	cfgY.DisableNotify, cfgY.PollInterval = true, time.Hour
	cfgY.Observer = claimsY
	y, stopY := startRelay(t, pool, cfgY)
	defer stopY()
	outboxtest.Eventually(t, livenessWait, "both relays' first claims", func() bool {
		return claimsX.n.Load() > 0 && claimsY.n.Load() > 0
	})
	writeEventsFor(t, pool, w, "warm-y") // Y's cursor set, before the events below
	outboxtest.Eventually(t, livenessWait, "warm-up by Y", func() bool { y.Wake(); return countUnpublished(t, pool, schema) == 0 })

	unlock := slowClaims(t, pool, schema, "relay-x")
	// Y may still hold a wake-up from the warm-up loop (wakes collapse into
	// one buffered slot) and claim the new events before X does; then X's
	// claim finds nothing to wait on. Try again with new events until X's
	// claim is the one that waits.
	var ids []string
	for attempt := 1; ; attempt++ {
		ids = []string{fmt.Sprintf("stop-%d-1", attempt), fmt.Sprintf("stop-%d-2", attempt)}
		writeEventsFor(t, pool, w, ids...)
		x.Wake()
		if claimWaitingUnlessTaken(t, pool, schema, "relay-y", ids) {
			break
		}
		if attempt == 5 {
			t.Fatal("relay Y claimed the new events before X in 5 attempts")
		}
		wakeUntilPublished(t, pool, schema, y, "events Y claimed before X", ids...)
	}
	gateMu.Lock()
	gateOpen = make(chan struct{})
	open := gateOpen
	gateMu.Unlock()
	var opened sync.Once
	openGate := func() { opened.Do(func() { close(open) }) }
	defer openGate()
	stopped := make(chan struct{})
	go func() { stopX(); close(stopped) }() // X's Run ends while its claim's statement is in flight
	outboxtest.Eventually(t, livenessWait, "X's claim given up", func() bool { return claimsX.errs.Load() > 0 })
	unlock()
	outboxtest.Eventually(t, livenessWait, "the claim's statement committed", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events
			WHERE aggregate_id = ANY($1) AND claimed_by = 'relay-x'`, ids).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 2
	})
	openGate()
	<-stopped
	wakeUntilPublished(t, pool, schema, y, "events whose claim was in flight when their relay stopped", ids...)
}

// claimErrors counts a relay's claims and those that failed.
type claimErrors struct{ n, errs atomic.Int64 }

func (c *claimErrors) ObserveClaim(o outbox.ClaimObservation) {
	c.n.Add(1)
	if o.Err != nil {
		c.errs.Add(1)
	}
}
