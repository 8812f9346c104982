package outbox_test

import (
	"context"
	"errors"
	"strconv"
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

// laneState is how one lane's unpublished events and counter row look.
type laneState struct {
	head            int64 // lowest unpublished sequence, 0 when none
	headQuarantined bool
	behind          int64 // unpublished events after the head
	behindParked    int64 // of those, parked (available_at = infinity)
	flagged         bool  // the counter row's parked_at is set
}

func readLane(t testing.TB, pool *pgxpool.Pool, schema, id string) laneState {
	t.Helper()
	var s laneState
	err := pool.QueryRow(context.Background(), `WITH h AS (
	SELECT aggregate_sequence, quarantined_at IS NOT NULL AS q FROM `+schema+`.outbox_events
	WHERE published_at IS NULL AND aggregate_type = 'order' AND aggregate_id = $1 ORDER BY aggregate_sequence LIMIT 1)
SELECT coalesce((SELECT aggregate_sequence FROM h), 0), coalesce((SELECT q FROM h), false),
	(SELECT count(*) FROM `+schema+`.outbox_events e WHERE e.published_at IS NULL AND e.aggregate_type = 'order'
	   AND e.aggregate_id = $1 AND e.aggregate_sequence > coalesce((SELECT aggregate_sequence FROM h), 0)),
	(SELECT count(*) FROM `+schema+`.outbox_events e WHERE e.published_at IS NULL AND e.aggregate_type = 'order'
	   AND e.aggregate_id = $1 AND e.aggregate_sequence > coalesce((SELECT aggregate_sequence FROM h), 0)
	   AND e.available_at = 'infinity'),
	coalesce((SELECT parked_at IS NOT NULL FROM `+schema+`.outbox_aggregates WHERE aggregate_type = 'order' AND aggregate_id = $1), false)`,
		id).Scan(&s.head, &s.headQuarantined, &s.behind, &s.behindParked, &s.flagged)
	if err != nil {
		t.Fatalf("read lane %s: %v", id, err)
	}
	return s
}

// checkParkedRight asserts the parking of a lane: behind a quarantined head
// every waiting event is parked and the lane flagged; behind a live head (or
// no head) none is, and the lane is not flagged.
func checkParkedRight(t testing.TB, pool *pgxpool.Pool, schema, id string) laneState {
	t.Helper()
	s := readLane(t, pool, schema, id)
	if !parkedRight(s) && s.headQuarantined {
		t.Fatalf("lane %s: head #%d quarantined, %d of %d waiting events parked, flagged %v: want all parked and flagged", id, s.head, s.behindParked, s.behind, s.flagged)
	}
	if !parkedRight(s) {
		t.Fatalf("lane %s: head #%d live, %d of %d waiting events parked, flagged %v: want none parked, not flagged", id, s.head, s.behindParked, s.behind, s.flagged)
	}
	return s
}

// parkedRight reports whether the lane's events behind a quarantined head
// are all parked and flagged, and none of a live lane is.
func parkedRight(s laneState) bool {
	if s.headQuarantined {
		return s.behindParked == s.behind && s.flagged
	}
	return s.behindParked == 0 && !s.flagged
}

// TestQuarantineParksLaneUntilRetryOrSkip: when the relay quarantines a
// head, the events behind it are parked in the same settle, an event written
// to the lane afterwards is written parked, and they still count as pending
// and blocked; Retry (agg-1) and Skip (agg-2) unpark the lane in their
// transaction, and the lanes drain in order.
func TestQuarantineParksLaneUntilRetryOrSkip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	admin := newAdmin(t, pool, schema)
	var fixed atomic.Bool
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if (m.AggregateID == "agg-1" && !fixed.Load() || m.AggregateID == "agg-2") && m.Sequence == 2 {
			return outbox.Permanent(errors.New("refused " + m.AggregateID))
		}
		return nil
	}}
	writeEvents(t, pool, w, 3, 5) // agg-0..agg-2, sequences 1..5
	cfg := quietConfig(schema, pub)
	cfg.BatchSize = 2 // #2 is a head when it fails, #3.. are not claimed with it
	startRelay(t, pool, cfg)
	outboxtest.Eventually(t, 30*time.Second, "agg-1 #2 and agg-2 #2 quarantined, the rest published", func() bool {
		st, err := admin.Status(ctx)
		return err == nil && st.Quarantined == 2 && st.Pending == 6 && st.Leased == 0
	})
	for _, id := range []string{"agg-1", "agg-2"} {
		if s := checkParkedRight(t, pool, schema, id); !s.headQuarantined || s.behind != 3 {
			t.Fatalf("lane %s: %+v, want head #2 quarantined and 3 parked behind", id, s)
		}
	}
	checkParkedRight(t, pool, schema, "agg-0")

	// Written to a parked lane: born parked, counted as pending and blocked.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.InsertTx(ctx, tx, orderEvent("agg-1", "Late"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.InsertTx(ctx, tx, orderEvent("agg-2", "Late1"), orderEvent("agg-2", "Late2"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if s := checkParkedRight(t, pool, schema, "agg-1"); s.behind != 4 {
		t.Fatalf("agg-1: %+v, want 4 parked behind #2", s)
	}
	if s := checkParkedRight(t, pool, schema, "agg-2"); s.behind != 5 {
		t.Fatalf("agg-2: %+v, want 5 parked behind #2", s)
	}
	st, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.BlockedByQuarantine != 9 || st.Pending != 9 || st.Quarantined != 2 {
		t.Fatalf("status: %d blocked, %d pending, %d quarantined; want 9, 9 and 2 (parked events are pending and blocked)", st.BlockedByQuarantine, st.Pending, st.Quarantined)
	}
	g, err := admin.Gauges(ctx)
	if err != nil || g.Pending != 9 {
		t.Fatalf("gauges: %d pending (err %v), want 9", g.Pending, err)
	}

	fixed.Store(true)
	if _, err := admin.Retry(ctx, eventID(t, pool, schema, "agg-1", 2), "carol"); err != nil {
		t.Fatal(err)
	}
	checkParkedRight(t, pool, schema, "agg-1") // unparked in Retry's transaction (or already published)
	if _, err := admin.Skip(ctx, eventID(t, pool, schema, "agg-2", 2), "dave", "refused for good"); err != nil {
		t.Fatal(err)
	}
	checkParkedRight(t, pool, schema, "agg-2")
	outboxtest.Eventually(t, 30*time.Second, "all lanes drained", func() bool { return unpublished(t, pool, schema) == 0 })
	lanes := checkOrderAllowingSkips(t, b.streamEvents(t))
	if len(lanes["order/agg-0"]) != 5 || len(lanes["order/agg-1"]) != 6 || len(lanes["order/agg-2"]) != 6 {
		t.Fatalf("at the broker: %d, %d, %d events; want 5, 6 and 6 (agg-2 #2 skipped)",
			len(lanes["order/agg-0"]), len(lanes["order/agg-1"]), len(lanes["order/agg-2"]))
	}
	for _, id := range []string{"agg-0", "agg-1", "agg-2"} {
		checkParkedRight(t, pool, schema, id)
	}
}

// TestWritersRacingQuarantineKeepLanesParkedRight: writers keep appending to
// lanes (one event and several events per transaction) while the relay
// quarantines their heads and an operator retries them. Whenever the
// writers pause, no unparked event waits behind a quarantined head and no
// parked event behind a live one; at the end everything is published in
// order.
func TestWritersRacingQuarantineKeepLanesParkedRight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	admin := newAdmin(t, pool, schema)
	const lanes = 4
	var healed atomic.Bool
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if !healed.Load() && m.Sequence%25 == 0 && m.AggregateID != "lane-3" {
			return outbox.Permanent(errors.New("refused"))
		}
		return nil
	}}
	cfg := quietConfig(schema, pub)
	cfg.BatchSize = 20
	startRelay(t, pool, cfg)

	write := func(n int) {
		var wg sync.WaitGroup
		for g := 0; g < 3; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := 0; i < n; i++ {
					id := "lane-" + strconv.Itoa((g+i)%lanes)
					evs := []outbox.Event{orderEvent(id, "Step")}
					if i%3 == 0 {
						evs = append(evs, orderEvent(id, "Step"), orderEvent(id, "Step"))
					}
					if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						_, err := w.InsertTx(ctx, tx, evs...)
						return err
					}); err != nil {
						t.Error(err)
						return
					}
				}
			}(g)
		}
		wg.Wait()
	}
	retryAll := func() {
		q, err := admin.ListQuarantined(ctx, outbox.QuarantineFilter{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range q {
			if _, err := admin.Retry(ctx, e.ID, "racer"); err != nil {
				t.Fatal(err)
			}
		}
	}
	for round := 0; round < 4; round++ {
		done := make(chan struct{})
		go func() { defer close(done); write(60) }()
		if round > 0 {
			// Retry while the writers append: unparking races them too.
			outboxtest.Eventually(t, 30*time.Second, "a quarantine to retry", func() bool {
				st, err := admin.Status(ctx)
				return err == nil && st.Quarantined > 0
			})
			retryAll()
		}
		<-done
		if t.Failed() {
			return
		}
		// Settled: every lane's head is quarantined or the lane drained.
		outboxtest.Eventually(t, 30*time.Second, "lanes settled", func() bool {
			st, err := admin.Status(ctx)
			return err == nil && st.Leased == 0 && st.Pending == st.BlockedByQuarantine
		})
		// A settle that found a lane's counter row held by a writer left the
		// lane to the lane sweep, which the relay wakes: parked right soon,
		// not at once.
		for l := 0; l < lanes; l++ {
			id := "lane-" + strconv.Itoa(l)
			outboxtest.Eventually(t, 30*time.Second, "lane "+id+" parked right", func() bool {
				return parkedRight(readLane(t, pool, schema, id))
			})
			checkParkedRight(t, pool, schema, id)
		}
	}
	healed.Store(true)
	retryAll()
	outboxtest.Eventually(t, 60*time.Second, "all published", func() bool { return unpublished(t, pool, schema) == 0 })
	for l := 0; l < lanes; l++ {
		checkParkedRight(t, pool, schema, "lane-"+strconv.Itoa(l))
	}
	seen := checkBrokerOrder(t, b.streamEvents(t))
	if n := countEvents(t, pool, schema); len(seen) != n {
		t.Fatalf("%d events at the broker, %d written", len(seen), n)
	}
}

// TestClaimCostFlatInBlockedEvents: the claim's cost, in shared buffers from
// EXPLAIN (ANALYZE, BUFFERS), is the same with 12,000 events blocked behind a
// quarantined head as with none (the same healthy backlog in both schemas).
// 12,000: more than the settle parks (10,000), so that the lane sweep parks
// the rest, and enough that a claim reading them would read several times
// its buffers (about two a blocked event before parking, below); 20,000
// until 7 December 2026, when CI's time went over its budget.
func TestClaimCostFlatInBlockedEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	measure := func(blocked int) claimPlan {
		pool, schema := outboxtest.Schema(t)
		w := newWriter(t, schema)
		b := newNATS(t, outboxtest.NATSURL(), 0)
		pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
			if m.AggregateID == "poison" {
				return outbox.Permanent(errors.New("refused"))
			}
			return nil
		}}
		// The blocked lane first (its events are the oldest), written by the
		// writer, 1,000 per transaction.
		for done := 0; done < blocked+1; done += 1000 {
			evs := make([]outbox.Event, min(1000, blocked+1-done))
			for i := range evs {
				evs[i] = orderEvent("poison", "Step")
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.InsertTx(ctx, tx, evs...); return err }); err != nil {
				t.Fatal(err)
			}
		}
		r, stop := startRelay(t, pool, quietConfig(schema, pub))
		outboxtest.Eventually(t, 60*time.Second, "poison #1 quarantined", func() bool { return r.Stats().Quarantined == 1 })
		// The settle parks 10,000 events; the relay's lane sweep, woken by
		// it, the rest.
		outboxtest.Eventually(t, 60*time.Second, "poison lane parked", func() bool {
			s := readLane(t, pool, schema, "poison")
			return s.flagged && s.behindParked == s.behind
		})
		stop()
		if s := checkParkedRight(t, pool, schema, "poison"); s.behind != int64(blocked) {
			t.Fatalf("poison lane %+v, want %d blocked", s, blocked)
		}
		writeEvents(t, pool, w, 200, 3) // a healthy backlog: 200 lanes of 3
		// As autovacuum would (it is off on the development machine): the
		// parked rows' old versions are dead.
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+schema+".outbox_events"); err != nil {
			t.Fatal(err)
		}
		cfg := quietConfig(schema, pub)
		cfg.BatchSize = 100
		rx, err := outbox.NewRelay(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		explainClaim(t, rx) // warm the cache
		p := explainClaim(t, rx)
		if p.rows == 0 || p.seqScan {
			t.Fatalf("claim with %d blocked: %d rows, sequential scan %v:\n%s", blocked, p.rows, p.seqScan, p.text)
		}
		return p
	}
	const nBlocked = 12000
	base, blocked := measure(0), measure(nBlocked)
	t.Logf("claim buffers: %d with 0 blocked, %d with %d blocked (%.2f ms, %.2f ms)", base.buffers, blocked.buffers, nBlocked, base.execMillis, blocked.execMillis)
	// Without parking the claim read every blocked event (2,357 buffers with
	// none, 43,385 with 20,000: some 25,000 with 12,000). With parking it reads the same rows as
	// without blocked events, plus, while a snapshot of another session (a
	// concurrent test) keeps VACUUM from removing them, the index pages of
	// the parked rows' old versions: some hundreds of buffers. Twice the base
	// tells the two apart without depending on what else runs.
	if blocked.buffers > 2*base.buffers {
		t.Fatalf("claim read %d buffers with %d blocked events, %d with none: the cost grows with blocked events\n%s", blocked.buffers, nBlocked, base.buffers, blocked.text)
	}
}

// TestMigrationAndSweepUnstickLanes: migration 006 flags the lanes already
// blocked when it runs, and the lane sweep parks their waiting events (in
// bounded transactions), parks events written to a parked lane by a writer
// that does not read the flag (plain SQL, as another language would), and
// unparks a lane whose quarantine an operator lifted by hand.
func TestMigrationAndSweepUnstickLanes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// Back to version 4 (what a database upgraded from before 006 has).
	exec(`DROP INDEX ` + schema + `.outbox_aggregates_parked_idx`)
	exec(`ALTER TABLE ` + schema + `.outbox_aggregates DROP COLUMN parked_at, DROP COLUMN parked_through`)
	exec(`DELETE FROM ` + schema + `.outbox_schema_migrations WHERE version >= 6`)
	// Events written as another language would: a counter row and rows.
	insert := func(id string, from, to int) {
		t.Helper()
		exec(`INSERT INTO `+schema+`.outbox_aggregates (aggregate_type, aggregate_id, last_sequence) VALUES ('order', $1, $2)
			ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_sequence = EXCLUDED.last_sequence`, id, to)
		exec(`INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
			SELECT gen_random_uuid(), 'order', $1, s, 'Step', '{}' FROM generate_series($2::bigint, $3::bigint) s`, id, from, to)
	}
	insert("big", 1, 25001)  // head quarantined, 25,000 waiting: three sweep transactions
	insert("lifted", 1, 11)  // head quarantined, later lifted by hand
	insert("healthy", 1, 10) // nothing quarantined
	exec(`UPDATE ` + schema + `.outbox_events SET quarantined_at = now(), attempt_count = 20, last_error = 'refused'
		WHERE aggregate_id IN ('big', 'lifted') AND aggregate_sequence = 1`)

	res, err := outboxmigrate.Migrate(ctx, pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Applied) == 0 || res.Applied[0] != 6 { // and the later versions, deleted too
		t.Fatalf("applied %v, want 6 first", res.Applied)
	}
	if s := readLane(t, pool, schema, "big"); !s.flagged || s.behindParked != 0 {
		t.Fatalf("big after the migration: %+v, want flagged, its events left to the sweep", s)
	}
	if s := readLane(t, pool, schema, "healthy"); s.flagged {
		t.Fatalf("healthy after the migration: %+v, want not flagged", s)
	}

	sw, err := outbox.SweepLanes(ctx, pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	if sw.Parked != 25000+10 || sw.Busy != 0 {
		t.Fatalf("sweep: %+v, want 25,010 events parked", sw)
	}
	for _, id := range []string{"big", "lifted", "healthy"} {
		checkParkedRight(t, pool, schema, id)
	}

	// Another language appends to a parked lane without reading the flag;
	// an operator lifts a quarantine by hand.
	insert("big", 25002, 25003)
	exec(`UPDATE ` + schema + `.outbox_events SET quarantined_at = NULL, attempt_count = 0 WHERE aggregate_id = 'lifted' AND aggregate_sequence = 1`)
	sw, err = outbox.SweepLanes(ctx, pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	// 11 in lifted: its 10 waiting events and its head, as written (a
	// quarantine set and lifted by hand never rescheduled it), made due so
	// that the incremental claim finds it.
	if sw.Parked != 2 || sw.Unparked != 11 || sw.Lanes != 2 {
		t.Fatalf("second sweep: %+v, want 2 parked in big, 11 unparked in lifted (10 waiting and the head)", sw)
	}
	var headDue bool
	if err := pool.QueryRow(ctx, `SELECT available_at <> occurred_at FROM `+schema+`.outbox_events WHERE aggregate_id = 'lifted' AND aggregate_sequence = 1`).Scan(&headDue); err != nil {
		t.Fatal(err)
	}
	if !headDue {
		t.Fatal("the sweep left the lifted head as written, behind the relays' cursors")
	}
	for _, id := range []string{"big", "lifted", "healthy"} {
		checkParkedRight(t, pool, schema, id)
	}
	if sw, err = outbox.SweepLanes(ctx, pool, schema); err != nil || sw.Lanes != 0 {
		t.Fatalf("third sweep: %+v (err %v), want nothing to do", sw, err)
	}
}
