package outbox_test

import (
	"context"
	"errors"
	"fmt"
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

// freshOnly is a relay configuration whose claims, after the first, only
// read what is new: the periodic full scan is an hour away, so anything the
// test sees published was found by the incremental claim.
func freshOnly(schema string, pub outbox.Publisher) outbox.RelayConfig {
	cfg := quietConfig(schema, pub)
	cfg.RescanInterval = time.Hour
	return cfg
}

func countUnpublished(t testing.TB, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".outbox_events WHERE published_at IS NULL").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// pinXmin opens a transaction that holds the database's xmin horizon, as a
// forgotten psql session does: no row version deleted or updated after it
// began can be removed until it ends.
func pinXmin(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT txid_current()"); err != nil {
		t.Fatal(err)
	}
}

// TestFreshClaimFlatUnderPinnedXmin publishes events while a transaction
// holds the xmin horizon, so that every published event leaves a dead entry
// in the claim's indexes. The full scan reads them all; the incremental
// claim, which starts from its cursor, reads the same whether 200 or 6,200
// events were published since the transaction began.
func TestFreshClaimFlatUnderPinnedXmin(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	pinXmin(t)
	cfg := freshOnly(schema, b.pub)
	cfg.BatchSize = 100
	measure := func(n int) (fresh, full claimPlan) {
		writeEvents(t, pool, w, 100, n/100)
		r, stop := startRelay(t, pool, cfg)
		outboxtest.Eventually(t, 2*time.Minute, "all published", func() bool { return countUnpublished(t, pool, schema) == 0 })
		stop()
		explainFresh(t, r) // warm the cache
		return explainFresh(t, r), explainClaim(t, r)
	}
	fresh1, full1 := measure(200)
	fresh2, full2 := measure(6000)
	if testing.Verbose() {
		t.Log(fresh1.text)
	}
	t.Logf("buffers: incremental claim %d after 200 events, %d after 6,200; full scan %d, %d",
		fresh1.buffers, fresh2.buffers, full1.buffers, full2.buffers)
	if full2.buffers < 4*full1.buffers {
		t.Fatalf("the full scan read %d buffers after 6,200 events and %d after 200: the pinned xmin did not keep the dead entries", full2.buffers, full1.buffers)
	}
	if fresh2.buffers > fresh1.buffers+50 {
		t.Fatalf("the incremental claim read %d buffers after 6,200 events published under a pinned xmin, %d after 200: it walks settled history\n%s\n%s",
			fresh2.buffers, fresh1.buffers, fresh2.text, fresh1.text)
	}
	if fresh2.seqScan {
		t.Fatalf("the incremental claim scans the table:\n%s", fresh2.text)
	}
}

func explainFresh(t *testing.T, r *outbox.Relay) claimPlan {
	t.Helper()
	text, err := r.ExplainFreshClaim(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return parsePlan(text)
}

// TestFreshClaimFindsLateCommits writes an event in a transaction that stays
// open while the relay claims and publishes others, then commits it: the
// incremental claim must find it although the relay's cursor moved past the
// moment it was written. Two shapes: a transaction that wrote early (its id
// was among the running ones at the cursor's snapshot) and one that was
// open early but wrote late (its id is newer than the cursor).
func TestFreshClaimFindsLateCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	r, stop := startRelay(t, pool, freshOnly(schema, b.pub))
	defer stop()

	early, err := pool.Begin(ctx) // writes at once, commits last
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = early.Rollback(ctx) }()
	if _, err := w.InsertTx(ctx, early, orderEvent("late-early", "Created")); err != nil {
		t.Fatal(err)
	}
	lateWriter, err := pool.Begin(ctx) // open now, writes later
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lateWriter.Rollback(ctx) }()
	if _, err := lateWriter.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	// Other events, one transaction each, each waited for: the relay claims
	// in between and its cursor moves on.
	for i := range 20 {
		writeEventsFor(t, pool, w, fmt.Sprintf("other-%d", i))
		outboxtest.Eventually(t, 30*time.Second, "other event published", func() bool { return countUnpublished(t, pool, schema) == 0 })
	}
	if _, err := w.InsertTx(ctx, lateWriter, orderEvent("late-late", "Created")); err != nil {
		t.Fatal(err)
	}
	for _, tx := range []pgx.Tx{lateWriter, early} {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		writeEventsFor(t, pool, w, "after-commit") // a claim after the commit
	}
	outboxtest.Eventually(t, 30*time.Second, "late commits published", func() bool { return countUnpublished(t, pool, schema) == 0 })
	checkBrokerOrder(t, b.streamEvents(t))
	if st := r.Stats(); st.Published != 24 {
		t.Fatalf("published %d events, want 24", st.Published)
	}
}

// slowPublisher holds each call for a moment, so that the next event of a
// lane commits while its predecessor is in flight.
type slowPublisher struct {
	next  outbox.Publisher
	delay time.Duration
}

func (p slowPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	t := time.NewTimer(p.delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return p.next.Publish(ctx, msgs)
}

// TestFreshClaimContinuesLanes writes a busy aggregate's events one per
// transaction while two relays publish, so that event k+1 commits while k is
// in flight at one relay and the other relay's claim sees k+1 as not the
// head of its lane and moves its cursor past it. Only the relay that
// publishes k looks for k+1 afterwards; without that, k+1 would wait for a
// full scan (an hour away here).
func TestFreshClaimContinuesLanes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	pub := slowPublisher{next: b.pub, delay: 3 * time.Millisecond}
	for range 2 {
		_, stop := startRelay(t, pool, freshOnly(schema, pub))
		defer stop()
	}
	const busy, others = 150, 10
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range busy / 2 {
				id := "busy"
				if i%others == 0 {
					id = fmt.Sprintf("quiet-%d-%d", g, i)
				}
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := w.InsertTx(ctx, tx, orderEvent(id, "Tick"))
					return err
				}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(time.Minute)
	for countUnpublished(t, pool, schema) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if countUnpublished(t, pool, schema) > 0 {
		rows, err := pool.Query(ctx, `SELECT aggregate_id, aggregate_sequence, dispatch_xid::text, claimed_by, claim_until::text, available_at::text, occurred_at::text, attempt_count
			FROM `+schema+`.outbox_events WHERE published_at IS NULL ORDER BY aggregate_id, aggregate_sequence`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			vals, _ := rows.Values()
			t.Log(vals...)
		}
		t.Fatal("not every event was published within a minute")
	}
	seen := checkBrokerOrder(t, b.streamEvents(t))
	if len(seen) != busy {
		t.Fatalf("%d events reached the broker, want %d", len(seen), busy)
	}
}

// TestFreshClaimFindsRescheduledEvents checks the events that become due by
// time or by an operator, not by a commit: a failed publish retried after
// its backoff, and a quarantined event retried by an operator. Their
// transactions are behind the relay's cursor; outbox_due_idx is how
// the incremental claim finds them.
func TestFreshClaimFindsRescheduledEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	var flaky, refused atomic.Int32
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		switch m.AggregateID {
		case "flaky":
			if flaky.Add(1) <= 2 {
				return errors.New("try again")
			}
		case "refused":
			if refused.Add(1) == 1 {
				return outbox.Permanent(errors.New("refused"))
			}
		}
		return nil
	}}
	r, stop := startRelay(t, pool, freshOnly(schema, pub))
	defer stop()
	writeEventsFor(t, pool, w, "flaky", "refused", "fine")
	outboxtest.Eventually(t, 30*time.Second, "flaky published after its backoffs, refused quarantined", func() bool {
		return r.Stats().Quarantined == 1 && countUnpublished(t, pool, schema) == 1
	})
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	var id [16]byte
	if err := pool.QueryRow(ctx, "SELECT event_id FROM "+schema+".outbox_events WHERE quarantined_at IS NOT NULL").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Retry(ctx, id, "test"); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "retried event published", func() bool { return countUnpublished(t, pool, schema) == 0 })
}

// TestFullScanFindsWhatTheCursorDoesNot checks the periodic full scan: a
// lease left by a relay that died (its events' transactions are behind every
// cursor) and rows without a dispatch_xid (written before migration 009)
// are published once the full scan runs.
func TestFullScanFindsWhatTheCursorDoesNot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := quietConfig(schema, b.pub)
	cfg.RescanInterval = 200 * time.Millisecond
	r, stop := startRelay(t, pool, cfg)
	defer stop()
	writeEventsFor(t, pool, w, "warm-up")
	outboxtest.Eventually(t, 30*time.Second, "warm-up published", func() bool { return countUnpublished(t, pool, schema) == 0 })
	// A dead relay's lease, and a row as written before migration 009 (no
	// dispatch_xid), both invisible to the incremental claim.
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_events
		(event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes, dispatch_xid, claimed_by, claim_token, claim_until)
		VALUES (gen_random_uuid(), 'order', 'leased', 1, 'Created', '{}', DEFAULT, 'dead', gen_random_uuid(), now() + interval '300 milliseconds'),
		       (gen_random_uuid(), 'order', 'legacy', 1, 'Created', '{}', NULL, NULL, NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "both published", func() bool { return countUnpublished(t, pool, schema) == 0 })
	if st := r.Stats(); st.TakenOver != 1 {
		t.Fatalf("taken over %d events, want 1", st.TakenOver)
	}
}

// TestFreshClaimPlannedOnEmptyStatistics plans the incremental claim as
// PostgreSQL would on a table analyzed while empty (a new deployment, or
// autovacuum off) and then filled, and on one analyzed with most of its
// events published (autovacuum's view of a busy outbox: the generic plan
// then walked outbox_pending_lane_idx whole for the points, 57 ms of a
// 68 ms claim under a pinned xmin, issue 24): every lookup must go through
// the index made for it, never walk a partial index of pending events with
// a filter, which is a read of every pending event and every dead entry.
func TestFreshClaimPlannedOnEmptyStatistics(t *testing.T) {
	t.Parallel()
	for _, stats := range []string{"analyzed empty", "analyzed young", "analyzed busy", "analyzed under a pinned xmin"} {
		t.Run(stats, func(t *testing.T) {
			t.Parallel()
			freshClaimPlanUsesItsIndexes(t, stats)
		})
	}
}

func freshClaimPlanUsesItsIndexes(t *testing.T, stats string) {
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	events := schema + ".outbox_events"
	busy := stats != "analyzed empty" && stats != "analyzed young"
	if stats == "analyzed young" {
		// The pressure bench's schema in its first minute: a few hundred
		// events, most published, analyzed by autovacuum; the relays'
		// generic plans are made then and kept while the table grows (under
		// a pinned xmin no vacuum shrinks it, and the estimates stay). On
		// such statistics the predecessor probe and the successors' lookup
		// walked outbox_dispatch_idx whole, per head: 77 s for one claim.
		if _, err := pool.Exec(ctx, `INSERT INTO `+events+` (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes, published_at)
			SELECT gen_random_uuid(), 'order', 'y' || (g % 50), g, 'OrderCreated', '{}', CASE WHEN g <= 250 THEN now() END
			FROM generate_series(1, 300) g`); err != nil {
			t.Fatal(err)
		}
	}
	if stats == "analyzed under a pinned xmin" {
		// The pressure bench's cell: a transaction holds the xmin while
		// events are written and published, one transaction each, so every
		// published event leaves its entries in the partial indexes of
		// pending events and vacuum may remove none; autovacuum's ANALYZE
		// still runs. With the cursor's place inside a transaction on a
		// two-column index (stop 33), the generic plan read the range from
		// outbox_pending_lane_idx whole, with a filter and a sort.
		pinned, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer pinned.Release()
		if _, err := pinned.Exec(ctx, `BEGIN`); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = pinned.Exec(context.Background(), `ROLLBACK`) }()
		if _, err := pinned.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
			t.Fatal(err)
		}
	}
	if !busy {
		if _, err := pool.Exec(ctx, `ANALYZE `+events); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+events+` (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes)
		SELECT gen_random_uuid(), 'order', 'o' || g, 1, 'OrderCreated', '{}' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	if busy {
		// One transaction per event, as writers commit them.
		if _, err := pool.Exec(ctx, `UPDATE `+events+` e SET dispatch_xid = (pg_current_xact_id()::text::bigint - 30000 + g.n)::text::xid8
			FROM (SELECT event_id, row_number() OVER () AS n FROM `+events+`) g WHERE g.event_id = e.event_id`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE `+events+` SET published_at = now() WHERE aggregate_id <> 'o1' AND aggregate_id NOT LIKE 'o1_'`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+events); err != nil {
			t.Fatal(err)
		}
	}
	fresh, err := outbox.FreshClaimStatement(schema, 1000)
	if err != nil {
		t.Fatal(err)
	}
	handOff, err := outbox.HandOffStatement(schema)
	if err != nil {
		t.Fatal(err)
	}
	planUsesIndexKeys(t, pool, "fresh", fresh, "force_generic_plan", `1000, 'r', gen_random_uuid(), 1000, '1', ARRAY['2','3'], ARRAY['order'], ARRAY['o1'], ARRAY[2::bigint], '00000000-0000-0000-0000-000000000000'`)
	// A hand-over of 100 lanes, planned for its values (a custom plan, as
	// PostgreSQL makes for the first five calls and whenever it finds one
	// cheaper): the pressure bench's took 94 lanes.
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = fmt.Sprintf("'o%d'", i+1)
	}
	planUsesIndexKeys(t, pool, "hand_off", handOff, "force_custom_plan",
		`array_fill('order'::text, ARRAY[100]), ARRAY[`+strings.Join(ids, ",")+`], array_fill(2::bigint, ARRAY[100])`)
}

// explainPrepared prepares stmt as name, plans it in the given
// plan_cache_mode and returns the plan's lines; args is the EXECUTE's
// argument list with its parentheses ("" for none).
func explainPrepared(t *testing.T, pool *pgxpool.Pool, name, stmt, mode, args string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, `RESET plan_cache_mode`) }()
	if _, err := conn.Exec(ctx, `PREPARE `+name+` AS `+stmt); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, `DEALLOCATE `+name) }()
	rows, err := conn.Query(ctx, `EXPLAIN EXECUTE `+name+args)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// planUsesIndexKeys prepares stmt, plans it in the given plan_cache_mode
// (force_generic_plan: the plan a relay's prepared statement keeps after
// five calls; force_custom_plan: one made for the values) and fails the test when a scan
// of outbox_events walks the table or an index without a condition on its
// key.
func planUsesIndexKeys(t *testing.T, pool *pgxpool.Pool, name, stmt, mode, args string) {
	t.Helper()
	plan := explainPrepared(t, pool, name, stmt, mode, "("+args+")")
	text := strings.Join(plan, "\n")
	for i, line := range plan {
		if !strings.Contains(line, "Scan") || strings.Contains(line, "CTE Scan") || strings.Contains(line, "Function Scan") ||
			strings.Contains(line, "Subquery Scan") || strings.Contains(line, "Bitmap Heap Scan") {
			continue
		}
		if strings.Contains(line, "Seq Scan on outbox_events") {
			t.Fatalf("%s: the statement scans the table:\n%s", name, text)
		}
		// An index scan must have an Index Cond on its next lines (before
		// the next node).
		cond := false
		for _, next := range plan[i+1:] {
			if strings.Contains(next, "->") {
				break
			}
			if strings.Contains(next, "Index Cond") {
				cond = true
			}
		}
		if !cond {
			t.Errorf("%s: an index is walked without a condition on its key:\n%s\n\n%s", name, line, text)
		}
		// The hand-over looks lanes up by key: a scan of an index of every
		// pending event (a bitmap scan of outbox_dispatch_idx, filtered by
		// the lanes) is the trap it fell into under a pinned xmin.
		// The incremental claim reads no index of every pending event: its
		// lookups have an index each (a walk of one of those, even with an
		// index condition on available_at, reads every dead entry too).
		if name == "fresh" && (strings.Contains(line, "outbox_dispatch_idx") || strings.Contains(line, "outbox_pending_lane_idx")) {
			t.Errorf("%s: an index of every pending event is read:\n%s\n\n%s", name, line, text)
		}
		if name == "hand_off" && (strings.Contains(line, "outbox_dispatch_idx") || strings.Contains(line, "outbox_fresh")) {
			t.Errorf("%s: lanes looked up through an index of pending events, not by key:\n%s\n\n%s", name, line, text)
		}
	}
}

// TestSafetyNetCursorWaitsForYoungEvents runs a relay with ReconcileAfter
// (the safety net beside a CDC relay), whose claims take only heads written
// at least that long ago. Its incremental claim reads the events while they
// are young and leaves them; its cursor must not pass them, or nothing would
// read them again once they are old (the full scan is an hour away here).
func TestSafetyNetCursorWaitsForYoungEvents(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := freshOnly(schema, b.pub)
	cfg.ReconcileAfter = 500 * time.Millisecond
	r, stop := startRelay(t, pool, cfg)
	defer stop()
	writeEventsFor(t, pool, w, "early")
	// Let the safety net claim a few times while the event is young; other
	// events keep arriving, so its cursor has reasons to move.
	for i := range 5 {
		writeEventsFor(t, pool, w, fmt.Sprintf("later-%d", i))
	}
	outboxtest.Eventually(t, 30*time.Second, "every event published by the safety net once old enough", func() bool {
		return countUnpublished(t, pool, schema) == 0
	})
	if st := r.Stats(); st.Published != 6 {
		t.Fatalf("published %d, want 6", st.Published)
	}
	checkBrokerOrder(t, b.streamEvents(t))
}

// TestSafetyNetDoesNotLockYoungEvents: the safety net beside a CDC stream
// reads the young events (its cursor must see them) but never locks one, not
// even for its claim's statement. It used to lock its whole window and drop
// the young rows after: the stream's claim, SKIP LOCKED, then left those
// events to wait, and its marks waited for the lock (issue 27: CDC's clean
// p50 95 ms, against 7 ms without). A row lock leaves the locker's id in the
// row's xmax, so a row no one locked keeps xmax 0.
func TestSafetyNetDoesNotLockYoungEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := freshOnly(schema, b.pub)
	cfg.ReconcileAfter = time.Hour
	claims := &claimCounter{}
	cfg.Observer = claims
	writeEventsFor(t, pool, w, "young")
	r, stop := startRelay(t, pool, cfg)
	defer stop()
	// Each claim after the first reads the event again: the conservative
	// cursor stays before it. An idle safety net looks every
	// ReconcileAfter/4 (15 minutes here): wake it.
	outboxtest.Eventually(t, 30*time.Second, "the safety net claims five times", func() bool {
		r.Wake()
		return claims.n.Load() >= 5
	})
	var locked int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox_events WHERE xmax::text <> '0'").Scan(&locked); err != nil {
		t.Fatal(err)
	}
	if locked != 0 {
		t.Fatalf("%d young events were locked by the safety net's claims; it must leave them to the stream untouched", locked)
	}
	if n := countUnpublished(t, pool, schema); n == 0 {
		t.Fatal("the safety net published a young event")
	}
}
