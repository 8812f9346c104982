package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestPublishIDsKeepsLaneOrderAndLeavesBlockedLanes hands PublishIDs the ids
// of three lanes, shuffled: a free lane is published whole and in order; a
// lane whose head is quarantined is left alone; a lane with a gap among the
// ids is published up to the gap. What is not published is counted in Left.
func TestPublishIDsKeepsLaneOrderAndLeavesBlockedLanes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	recs := writeEvents(t, pool, w, 3, 3) // agg-0..2, sequences 1..3; recs[round*3+agg]
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET quarantined_at = now()
		WHERE aggregate_id = 'agg-1' AND aggregate_sequence = 1`); err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for i, rec := range recs {
		if i == 1*3+2 { // agg-2's sequence 2: a gap among the ids
			continue
		}
		ids = append(ids, rec.ID)
	}
	unknown := uuid.New() // no such event: reported missing
	ids = append(ids, unknown)
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })

	r, err := outbox.NewRelay(pool, quietConfig(schema, b.pub))
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.PublishIDs(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if res.Published != 4 || res.Left != 5 || res.Unavailable || len(res.Missing) != 1 || res.Missing[0] != unknown {
		t.Fatalf("result %+v; want 4 published (agg-0 1..3, agg-2 1), 5 left, the unknown id missing", res)
	}
	msgs := b.streamEvents(t)
	checkBrokerOrder(t, msgs)
	var got []string
	for _, m := range msgs {
		got = append(got, fmt.Sprintf("%s/%d", m.AggregateID, m.Sequence))
	}
	want := map[string]bool{"agg-0/1": true, "agg-0/2": true, "agg-0/3": true, "agg-2/1": true}
	if len(got) != len(want) {
		t.Fatalf("at the broker: %v; want %v", got, want)
	}
	for _, g := range got {
		if !want[g] {
			t.Fatalf("at the broker: %v; want %v", got, want)
		}
	}
	if err := r.WaitPublishIDs(ctx); err != nil {
		t.Fatal(err)
	}
	if n := unpublished(t, pool, schema); n != 5 {
		t.Fatalf("%d unpublished events, want 5", n)
	}
	// The same ids again: the published ones are left (already done), the
	// quarantined lane still is.
	res, err = r.PublishIDs(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if res.Published != 0 || res.Left != len(ids) {
		t.Fatalf("second call %+v; want nothing published, all %d left", res, len(ids))
	}
}

// TestPublishIDsNeverTakesASuccessorWithoutItsPredecessor: ids holding only
// sequence 2 of a lane whose 1 is pending publish nothing.
func TestPublishIDsNeverTakesASuccessorWithoutItsPredecessor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	recs := writeEvents(t, pool, w, 1, 3)
	r, err := outbox.NewRelay(pool, quietConfig(schema, b.pub))
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.PublishIDs(ctx, []uuid.UUID{recs[1].ID, recs[2].ID})
	if err != nil {
		t.Fatal(err)
	}
	if res.Published != 0 || res.Left != 2 {
		t.Fatalf("result %+v; want nothing published while sequence 1 is pending", res)
	}
	res, err = r.PublishIDs(ctx, []uuid.UUID{recs[2].ID, recs[0].ID, recs[1].ID})
	if err != nil {
		t.Fatal(err)
	}
	if res.Published != 3 {
		t.Fatalf("result %+v; want the whole lane", res)
	}
	checkBrokerOrder(t, b.streamEvents(t))
}

// TestPublishIDsClaimsBehindEventsBeingMarked: a call whose events were all
// acknowledged returns before their marks are written; the next call claims
// and publishes their successors meanwhile (after them at the broker), and
// settles its own only after those marks, so the table never shows a
// successor published before its predecessor. A polling relay beside it
// finds nothing to take.
func TestPublishIDsClaimsBehindEventsBeingMarked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	recs := writeEvents(t, pool, w, 2, 2) // agg-0, agg-1, sequences 1 and 2; recs[round*2+agg]
	r, err := outbox.NewRelay(pool, quietConfig(schema, b.pub))
	if err != nil {
		t.Fatal(err)
	}
	release := outbox.HoldBackgroundMarks(r)
	defer release()
	first := []uuid.UUID{recs[0].ID, recs[1].ID} // sequence 1 of both
	res, err := r.PublishIDs(ctx, first)
	if err != nil || res.Published != 2 {
		t.Fatalf("first call: %+v, %v; want both published", res, err)
	}
	if n := unpublished(t, pool, schema); n != 4 {
		t.Fatalf("%d unpublished events while the marks are held, want 4", n)
	}
	// A polling relay meanwhile: sequence 1 is leased, sequence 2 is not a
	// head while 1 is unpublished in the table.
	second := make(chan outbox.PublishIDsResult, 1)
	go func() {
		res, err := r.PublishIDs(ctx, []uuid.UUID{recs[3].ID, recs[2].ID})
		if err != nil {
			t.Error(err)
		}
		second <- res
	}()
	outboxtest.Eventually(t, 10*time.Second, "sequence 2 at the broker", func() bool { return len(b.streamEvents(t)) == 4 })
	checkBrokerOrder(t, b.streamEvents(t))
	if n := unpublished(t, pool, schema); n != 4 {
		t.Fatalf("%d unpublished events while the first marks are held, want 4: the second call settled first", n)
	}
	select {
	case res := <-second:
		t.Fatalf("the second call returned (%+v) before the first call's marks were written", res)
	default:
	}
	pcfg := quietConfig(schema, b.pub)
	pcfg.ID, pcfg.PollInterval = "poll", 5*time.Millisecond
	claims := &claimCounter{}
	pcfg.Observer = claims
	poll, stopPoll := startRelay(t, pool, pcfg)
	outboxtest.Eventually(t, 10*time.Second, "three polling claims", func() bool { return claims.n.Load() >= 3 })
	stopPoll()
	if n := poll.Stats().Claimed; n != 0 {
		t.Fatalf("a polling relay claimed %d events that PublishIDs holds", n)
	}
	release()
	if res := <-second; res.Published != 2 || res.Left != 0 {
		t.Fatalf("second call %+v; want both successors published", res)
	}
	if err := r.WaitPublishIDs(ctx); err != nil {
		t.Fatal(err)
	}
	if n := unpublished(t, pool, schema); n != 0 {
		t.Fatalf("%d unpublished events after the marks, want 0", n)
	}
	var disorder int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events a JOIN `+schema+`.outbox_events b
		ON a.aggregate_id = b.aggregate_id AND b.aggregate_sequence = a.aggregate_sequence + 1
		WHERE b.published_at < a.published_at`).Scan(&disorder); err != nil {
		t.Fatal(err)
	}
	if disorder != 0 {
		t.Fatalf("%d successors marked published before their predecessor", disorder)
	}
}

// TestPublishIDsBesidePollingRelays: while writers add events, a CDC-like
// caller hands each committed transaction's ids to PublishIDs and two
// polling relays claim the same table. Every event reaches the broker exactly
// once (no crash, so no duplicate: the claims are exclusive) and every
// aggregate's first deliveries are in sequence order (I5).
func TestPublishIDsBesidePollingRelays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	// One polling relay reconciles (events older than 200ms), one races for
	// every event, slowly (one event per claim), so that all three take
	// their share.
	var polling []*outbox.Relay
	for i := 0; i < 2; i++ {
		cfg := quietConfig(schema, b.pub)
		cfg.ID = fmt.Sprintf("poll-%d", i)
		if i == 0 {
			cfg.BatchSize, cfg.ReconcileAfter = 7, 200*time.Millisecond
		} else {
			cfg.BatchSize, cfg.CatchUpInterval = 1, 10*time.Millisecond
		}
		r, _ := startRelay(t, pool, cfg)
		polling = append(polling, r)
	}
	cfg := quietConfig(schema, b.pub)
	cfg.ID = "ids"
	ids, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	feed := make(chan []uuid.UUID, 100)
	var published int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for batch := range feed {
			res, err := ids.PublishIDs(ctx, batch)
			if err != nil {
				t.Error(err)
				return
			}
			published += res.Published
		}
	}()
	var wg sync.WaitGroup
	const writers, txs = 4, 50
	for wr := 0; wr < writers; wr++ {
		wg.Add(1)
		go func(wr int) {
			defer wg.Done()
			for i := 0; i < txs; i++ {
				var recs []outbox.Recorded
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					recs, err = w.InsertTx(ctx, tx,
						orderEvent(fmt.Sprintf("a%d", i%6), fmt.Sprintf("W%d-%d", wr, i)),
						orderEvent(fmt.Sprintf("a%d", (i+wr)%6), fmt.Sprintf("W%d-%d-b", wr, i)))
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				batch := make([]uuid.UUID, len(recs))
				for j, rec := range recs {
					batch[j] = rec.ID
				}
				feed <- batch
			}
		}(wr)
	}
	wg.Wait()
	close(feed)
	<-done
	outboxtest.Eventually(t, 60*time.Second, "all events published", func() bool { return unpublished(t, pool, schema) == 0 })
	seen := checkBrokerOrder(t, b.streamEvents(t))
	if len(seen) != writers*txs*2 {
		t.Fatalf("%d distinct events at the broker, want %d", len(seen), writers*txs*2)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("event %s reached the broker %d times without any crash", id, n)
		}
	}
	p0, p1 := polling[0].Stats().Published, polling[1].Stats().Published
	t.Logf("published: %d by PublishIDs, %d by the reconciling relay, %d by the racing one", published, p0, p1)
	if published == 0 || p1 == 0 {
		t.Fatal("PublishIDs or the racing relay published nothing: the test did not exercise both")
	}
}

// TestPublishIDsRefusesARunningRelay: the CDC path needs a Relay of its own.
func TestPublishIDsRefusesARunningRelay(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	r, _ := startRelay(t, pool, quietConfig(schema, b.pub))
	outboxtest.Eventually(t, 10*time.Second, "relay ready", func() bool { return r.Ready() == nil })
	if _, err := r.PublishIDs(context.Background(), []uuid.UUID{uuid.New()}); err == nil {
		t.Fatal("PublishIDs ran on a relay whose Run is going")
	}
}

// TestPublishIDsReportsAnOutage: when the destination is unavailable the
// result says so (the CDC path then keeps its position and retries), and no
// attempt is spent.
func TestPublishIDsReportsAnOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	recs := writeEvents(t, pool, w, 2, 1)
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		errs := make([]error, len(msgs))
		for i := range errs {
			errs[i] = outbox.Unavailable(errors.New("connection refused"))
		}
		return errs
	})
	r, err := outbox.NewRelay(pool, quietConfig(schema, pub))
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.PublishIDs(ctx, []uuid.UUID{recs[0].ID, recs[1].ID})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Unavailable || res.RetryIn <= 0 || res.Published != 0 || res.Left != 2 {
		t.Fatalf("result %+v; want unavailable, a retry delay, nothing published", res)
	}
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(attempt_count), 0) FROM `+schema+`.outbox_events`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 {
		t.Fatalf("an outage spent %d attempts", attempts)
	}
}

// TestReconcileAfterLeavesYoungEvents: a relay with ReconcileAfter publishes
// only lanes whose head was written longer ago than the threshold.
func TestReconcileAfterLeavesYoungEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	writeEvents(t, pool, w, 2, 2)
	// agg-0's head is old; agg-1 was just written.
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET occurred_at = now() - interval '2 hours'
		WHERE aggregate_id = 'agg-0' AND aggregate_sequence = 1`); err != nil {
		t.Fatal(err)
	}
	cfg := quietConfig(schema, b.pub)
	cfg.ReconcileAfter = time.Hour
	claims := &claimCounter{}
	cfg.Observer = claims
	r, stop := startRelay(t, pool, cfg)
	outboxtest.Eventually(t, 30*time.Second, "the old lane published", func() bool { return unpublished(t, pool, schema) <= 2 })
	// Let the relay claim a few more times: agg-1 must stay. An idle safety
	// net looks every ReconcileAfter/4 (15 minutes here): wake it.
	after := claims.n.Load()
	outboxtest.Eventually(t, 30*time.Second, "relay claimed again", func() bool {
		r.Wake()
		return claims.n.Load() >= after+3
	})
	stop()
	if n := unpublished(t, pool, schema); n != 2 {
		t.Fatalf("%d unpublished; want agg-1's 2 events left alone", n)
	}
	msgs := b.streamEvents(t)
	checkBrokerOrder(t, msgs)
	for _, m := range msgs {
		if m.AggregateID != "agg-0" {
			t.Fatalf("young event %s/%d published by a reconciling relay", m.AggregateID, m.Sequence)
		}
	}
}

// TestClaimIDsLooksUpEachIDByKey: PublishIDs's statements find their rows
// through the primary key even when the table's statistics were taken while
// it was empty (a new outbox, or autovacuum behind): planned then, the
// claim's conditions once steered PostgreSQL to the dispatch index's range
// over every pending row, and the missing-ids check to a hash of the whole
// table, each call.
func TestClaimIDsLooksUpEachIDByKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	events := schema + ".outbox_events"
	if _, err := pool.Exec(ctx, `ANALYZE `+events); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+events+` (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes)
		SELECT gen_random_uuid(), 'order', 'o' || g, 1, 'OrderCreated', '{}' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	claim, missing, err := outbox.ClaimIDsStatements(schema)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, `RESET plan_cache_mode`) }()
	for name, stmt := range map[string]string{"claim": claim, "missing": missing} {
		if _, err := conn.Exec(ctx, `PREPARE plan_test AS `+stmt); err != nil {
			t.Fatal(err)
		}
		args := "ARRAY[gen_random_uuid()]"
		if name == "claim" {
			args += ", 'r', gen_random_uuid(), 1000, '{}'::uuid[]"
		}
		rows, err := conn.Query(ctx, `EXPLAIN EXECUTE plan_test(`+args+`)`)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `DEALLOCATE plan_test`); err != nil {
			t.Fatal(err)
		}
		text := strings.Join(plan, "\n")
		if strings.Contains(text, "Seq Scan on outbox_events") || strings.Contains(text, "outbox_dispatch_idx") ||
			!strings.Contains(text, "outbox_events_pkey") {
			t.Errorf("%s statement, planned on statistics of an empty table, does not look each id up by key:\n%s", name, text)
		}
	}
}

// TestClaimIDsRetriedWithItsTokenTakesItsRowsAgain: a claim by id whose
// connection is lost after it committed (a kill during the claim) is tried
// again with the same token, and must take its own rows again rather than
// find them leased and leave them to wait for the lease (issue 24: a killed
// statement must not delay events by a lease). Another token finds them
// leased.
func TestClaimIDsRetriedWithItsTokenTakesItsRowsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	writeEventsFor(t, pool, w, "a", "a", "b")
	claim, _, err := outbox.ClaimIDsStatements(schema)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, "SELECT event_id FROM "+schema+".outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	run := func(token uuid.UUID) int {
		t.Helper()
		rows, err := pool.Query(ctx, claim, ids, "cdc-1", token, 30000, []uuid.UUID{})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			n++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return n
	}
	token := uuid.New()
	if n := run(token); n != 3 {
		t.Fatalf("first claim took %d events, want 3", n)
	}
	if n := run(uuid.New()); n != 0 {
		t.Fatalf("a claim with another token took %d leased events, want 0", n)
	}
	if n := run(token); n != 3 {
		t.Fatalf("the claim tried again with its token took %d events, want its 3 again", n)
	}
}
