package outbox_test

// Liveness of the incremental claim: a committed event that is due must be
// claimed by the incremental claim itself, not left to the periodic full
// scan. Every test here runs relays whose full scan is an hour away
// (freshOnly) and waits far less than that: what the test sees published was
// found by the incremental claim. docs/design.md, "Claiming only what is
// new".

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// livenessWait bounds every wait of these tests: well below the full scan's
// hour (what an event a relay passes over waits for), and long enough for a
// loaded machine: 15 s was not (a take-over after a 5 s lease ran out of it
// at a load average of 10 on the 2-core machine). A passing test waits for
// its event, not for the bound.
const livenessWait = time.Minute

// warmUp writes one event and waits for it: the relay's first claim (a full
// scan) is behind it, and its later claims are incremental.
func warmUp(t *testing.T, pool *pgxpool.Pool, w *outbox.Writer, schema string) {
	t.Helper()
	writeEventsFor(t, pool, w, "warm-up")
	outboxtest.Eventually(t, livenessWait, "warm-up event published", func() bool { return countUnpublished(t, pool, schema) == 0 })
}

// dumpPending logs the pending events, for a failure's message.
func dumpPending(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT aggregate_id, aggregate_sequence, dispatch_xid::text, claimed_by,
		claim_until::text, available_at::text, occurred_at::text, quarantined_at IS NOT NULL, attempt_count
		FROM `+schema+`.outbox_events WHERE published_at IS NULL ORDER BY aggregate_id, aggregate_sequence`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		vals, _ := rows.Values()
		t.Log(vals...)
	}
}

// publishedSoon waits until the aggregates' events are all published.
func publishedSoon(t *testing.T, pool *pgxpool.Pool, schema, what string, ids ...string) {
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
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLivenessRetryOfEventWrittenAheadOfTheClock writes an event whose
// occurred_at is ahead of the database's clock (a writer that sets it from
// its own clock, an hour fast) and fails its first publish: the retry is due
// after the backoff. A backoff computed as "strictly after occurred_at"
// (greatest(now() + delay, occurred_at + 1µs)) made it wait for the writer's
// clock, an hour.
func TestLivenessRetryOfEventWrittenAheadOfTheClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	var fails atomic.Int32
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "ahead" && fails.Add(1) == 1 {
			return errors.New("try again")
		}
		return nil
	}}
	_, stop := startRelay(t, pool, freshOnly(schema, pub))
	defer stop()
	warmUp(t, pool, w, schema)
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_events
		(event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes, occurred_at)
		VALUES (gen_random_uuid(), 'order', 'ahead', 1, 'Created', '{}', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	publishedSoon(t, pool, schema, "an event written ahead of the clock, retried after a failure", "ahead")
	if fails.Load() < 2 {
		t.Fatalf("%d publish attempts, want the failure and its retry", fails.Load())
	}
}

// TestLivenessDueHeadsNotStarvedByDueNonHeads fills the rescheduled events
// that are due with events that are not their lane's head (released
// successors of a head that backs off for an hour, as an outage or a failed
// head leaves them), more than a claim's window, and then fails another
// lane's event once: its retry is due a moment later, behind all of them in
// available_at order. The incremental claim's look at due events must not
// spend its window on events it cannot claim.
func TestLivenessDueHeadsNotStarvedByDueNonHeads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	var fails atomic.Int32
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "victim" && fails.Add(1) == 1 {
			return errors.New("try again")
		}
		return nil
	}}
	cfg := freshOnly(schema, pub)
	cfg.BatchSize = 4 // a window of 5
	_, stop := startRelay(t, pool, cfg)
	defer stop()
	warmUp(t, pool, w, schema)
	// The blocked lane: its head backs off for an hour, its successors were
	// released half a minute ago. No dispatch_xid (rows from before
	// migration 009), so that only the look at due events reads them.
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_events
		(event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes, occurred_at, available_at, dispatch_xid)
		SELECT gen_random_uuid(), 'order', 'blocked', g, 'Tick', '{}', now() - interval '1 minute',
			CASE WHEN g = 1 THEN now() + interval '1 hour' ELSE now() - interval '30 seconds' END, NULL
		FROM generate_series(1, 12) g`); err != nil {
		t.Fatal(err)
	}
	writeEventsFor(t, pool, w, "victim")
	publishedSoon(t, pool, schema, "a due head behind due non-heads", "victim")
}

// TestLivenessCursorPassesOnlyWhatItRead fills the incremental claim's
// window of new events with events it cannot take, and checks that the
// cursor does not move past the events beyond the window, which the claim
// never read.
//
//   - leased: ten transactions write an aggregate's event each, more heads
//     than a batch of 4 takes. The first claim reads five, takes four and
//     leaves its cursor at the fifth, the lowest; the claim made ahead while
//     the four are published reads that one and the four (leased by this
//     relay), a full window, claims the one, and leaves nothing it does not
//     own: the cursor must still not pass the 5 events after the window.
//   - scheduled: one transaction writes 5 events due in an hour (a delayed
//     event written by hand) and then one due now, after them in the index.
func TestLivenessCursorPassesOnlyWhatItRead(t *testing.T) {
	t.Parallel()
	t.Run("leased", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool, schema := outboxtest.Schema(t)
		w := newWriter(t, schema)
		b := newNATS(t, outboxtest.NATSURL(), 0)
		inGate, openGate := make(chan struct{}), make(chan struct{})
		pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
			if m.AggregateID == "gate" {
				close(inGate)
				<-openGate
			}
			return nil
		}}
		// Each batch of the wide transactions is published slowly, so
		// that the claim made ahead runs while its events are leased.
		cfg := freshOnly(schema, slowPublisher{next: pub, delay: time.Second})
		cfg.BatchSize = 4
		_, stop := startRelay(t, pool, cfg)
		defer stop()
		warmUp(t, pool, w, schema)
		writeEventsFor(t, pool, w, "gate")
		<-inGate // the relay publishes; its next claim sees all of what follows
		// Ten transactions. The first to write (the lowest dispatch_xid)
		// is the last to begin (the latest occurred_at): the first claim
		// reads five, takes the four oldest and leaves it, holding its
		// cursor there; the claim made ahead reads it and the four leased.
		// A connection each, not the pool's: they are open at once.
		begin := func() pgx.Tx {
			conn, err := pgx.Connect(ctx, outboxtest.DatabaseURL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			if _, err := conn.Exec(ctx, "SET search_path TO "+schema); err != nil {
				t.Fatal(err)
			}
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // its start: occurred_at
				t.Fatal(err)
			}
			return tx
		}
		txs := make([]pgx.Tx, 10)
		for i := 1; i < len(txs); i++ {
			txs[i] = begin()
		}
		txs[0] = begin()
		var ids []string
		for i, tx := range txs {
			ids = append(ids, fmt.Sprintf("wide-%d", i))
			if _, err := w.InsertTx(ctx, tx, orderEvent(ids[i], "Tick")); err != nil {
				t.Fatal(err)
			}
		}
		for _, tx := range txs {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		close(openGate)
		publishedSoon(t, pool, schema, "transactions of more heads than a window", append(ids, "gate")...)
	})
	t.Run("scheduled", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool, schema := outboxtest.Schema(t)
		w := newWriter(t, schema)
		b := newNATS(t, outboxtest.NATSURL(), 0)
		cfg := freshOnly(schema, b.pub)
		cfg.BatchSize = 4
		_, stop := startRelay(t, pool, cfg)
		defer stop()
		warmUp(t, pool, w, schema)
		if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_events
			(event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes, available_at)
			SELECT gen_random_uuid(), 'order', 'later-' || g, 1, 'Tick', '{}', now() + interval '1 hour'
			FROM generate_series(1, 5) g;
			INSERT INTO `+schema+`.outbox_events
			(event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes)
			VALUES (gen_random_uuid(), 'order', 'now', 1, 'Tick', '{}')`); err != nil {
			t.Fatal(err)
		}
		publishedSoon(t, pool, schema, "an event after a window of delayed ones", "now")
	})
}

// TestLivenessSkipMovesTheLane skips a lane's quarantined head whose next
// event was committed while the head was quarantined and not parked (the
// relay's settle found the counter row busy, or the quarantine was set by
// hand): every relay's claim read that event as not the head of its lane,
// and its cursor passed it. The skip makes it the head; the incremental
// claim must find it.
func TestLivenessSkipMovesTheLane(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := freshOnly(schema, b.pub)
	cfg.LaneSweepInterval = time.Hour // nothing parks the lane
	_, stop := startRelay(t, pool, cfg)
	defer stop()
	warmUp(t, pool, w, schema)
	var head uuid.UUID
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		recs, err := w.InsertTx(ctx, tx, orderEvent("stuck", "Created"), orderEvent("stuck", "Paid"))
		if err != nil {
			return err
		}
		head = recs[0].ID
		_, err = tx.Exec(ctx, `UPDATE `+schema+`.outbox_events SET quarantined_at = now(), last_error = 'by hand' WHERE event_id = $1`, head)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// A later event published: a claim read the lane's second event, not a
	// head then, and moved on.
	writeEventsFor(t, pool, w, "later")
	publishedSoon(t, pool, schema, "the later event", "later")
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Skip(ctx, head, "test", "liveness"); err != nil {
		t.Fatal(err)
	}
	publishedSoon(t, pool, schema, "the event after a skipped head", "stuck")
}

// TestLivenessBlockedLaneDoesNotHoldTheCursor writes, behind a head that
// backs off for an hour, more events of its aggregate than the incremental
// claim's window, one transaction each (a busy aggregate whose first event
// the destination keeps refusing), and then another aggregate's event, all
// while the relay is busy publishing, so that its next claim sees them
// together. The blocked events are not heads: whoever publishes their head
// continues the lane, so the cursor may pass them, and must, or every claim
// reads the same window of them and nothing written after them is claimed
// before the full scan.
func TestLivenessBlockedLaneDoesNotHoldTheCursor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	inGate, openGate := make(chan struct{}), make(chan struct{})
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		switch {
		case m.AggregateID == "busy" && m.Sequence == 1:
			return errors.New("try again")
		case m.AggregateID == "gate":
			close(inGate)
			<-openGate
		}
		return nil
	}}
	cfg := freshOnly(schema, pub)
	cfg.BatchSize = 4 // a window of 5
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
	writeEventsFor(t, pool, w, "gate")
	<-inGate // the relay is publishing, not claiming
	for range 8 {
		writeEventsFor(t, pool, w, "busy")
	}
	writeEventsFor(t, pool, w, "bystander")
	close(openGate)
	publishedSoon(t, pool, schema, "an event written after a blocked lane's window", "bystander", "gate")
}

// TestLivenessTwoRelaysSavepointsRestart is the hunt's sweep over shapes
// that did not fail: two relays sharing a table, writers that insert inside
// savepoints (one rolled back, one released), a writer transaction left open
// across many claims, and one relay stopped and started again (its cursor
// set anew) while events keep coming. Everything is published by the
// incremental claims, in order per aggregate.
func TestLivenessTwoRelaysSavepointsRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfgA, cfgB := freshOnly(schema, b.pub), freshOnly(schema, b.pub)
	cfgA.ID, cfgB.ID = "relay-a", "relay-b"
	cfgA.BatchSize, cfgB.BatchSize = 4, 4
	_, stopA := startRelay(t, pool, cfgA)
	defer stopA()
	_, stopB := startRelay(t, pool, cfgB)
	warmUp(t, pool, w, schema)
	open, err := pool.Begin(ctx) // open across everything below
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = open.Rollback(ctx) }()
	if _, err := w.InsertTx(ctx, open, orderEvent("open", "Created")); err != nil {
		t.Fatal(err)
	}
	var ids []string
	write := func(i int) {
		id := fmt.Sprintf("agg-%d", i%7)
		ids = append(ids, id)
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SAVEPOINT a"); err != nil {
				return err
			}
			if _, err := w.InsertTx(ctx, tx, orderEvent("rolled-back", "Never")); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT a"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "SAVEPOINT b"); err != nil {
				return err
			}
			if _, err := w.InsertTx(ctx, tx, orderEvent(id, "Tick"), orderEvent(id, "Tock")); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "RELEASE SAVEPOINT b")
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 40 {
		write(i)
	}
	stopB() // B stops with whatever it held; A goes on
	for i := 40; i < 80; i++ {
		write(i)
	}
	_, stopB2 := startRelay(t, pool, cfgB) // B again, its cursor set anew
	defer stopB2()
	for i := 80; i < 120; i++ {
		write(i)
	}
	publishedSoon(t, pool, schema, "events written in savepoints, across a restart", ids...)
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	publishedSoon(t, pool, schema, "the long-open writer's event", "open")
	checkBrokerOrder(t, b.streamEvents(t))
	if n := countUnpublished(t, pool, schema); n != 0 {
		t.Fatalf("%d events unpublished", n)
	}
}

// TestLivenessStoppedRelayHandsItsLanesOver: relay X holds a lane's
// head k in flight; k+1 commits; relay Y's incremental claim reads k+1 (not
// a head: k is leased by X) and its cursor passes it. X then shuts down
// gracefully: it finishes the publish, marks k, and exits before its next
// claim. The continuation it kept in memory (cont) must not go with it:
// Relay.Run's last write makes k+1 due, and Y claims it (it failed before:
// nobody read k+1 again before Y's full scan, an hour away here).
func TestLivenessStoppedRelayHandsItsLanesOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	inGate, openGate := make(chan string, 2), make(chan struct{})
	var once sync.Once
	gated := func(id string) outbox.Publisher {
		return failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
			if m.AggregateID == "lane" && m.Sequence == 1 {
				once.Do(func() { inGate <- id })
				<-openGate
			}
			return nil
		}}
	}
	cfgA, cfgB := freshOnly(schema, gated("a")), freshOnly(schema, gated("b"))
	cfgA.ID, cfgB.ID = "relay-a", "relay-b"
	_, stopA := startRelay(t, pool, cfgA)
	_, stopB := startRelay(t, pool, cfgB)
	warmUp(t, pool, w, schema)
	writeEventsFor(t, pool, w, "lane")
	holder := <-inGate // the holder publishes k = 1, blocked
	stopHolder, other := stopA, "relay-b"
	if holder == "b" {
		stopHolder, other = stopB, "relay-a"
	}
	writeEventsFor(t, pool, w, "lane") // k+1, committed while k is in flight
	// The other relay claims something written after k+1: its incremental
	// claim has read k+1 (not a head then) and passed it.
	writeEventsFor(t, pool, w, "after")
	publishedSoon(t, pool, schema, "an event after k+1, by "+other, "after")
	// The holder shuts down: its publish of k finishes and is marked.
	go func() { close(openGate) }()
	stopHolder()
	var kPublished bool
	if err := pool.QueryRow(ctx, `SELECT published_at IS NOT NULL FROM `+schema+`.outbox_events
		WHERE aggregate_id = 'lane' AND aggregate_sequence = 1`).Scan(&kPublished); err != nil {
		t.Fatal(err)
	}
	if !kPublished {
		t.Fatal("the stopped relay did not mark k (the test's premise)")
	}
	writeEventsFor(t, pool, w, "poke") // wakes the survivor: claims keep happening
	publishedSoon(t, pool, schema, "k+1 after the relay that published k stopped; "+other+" is alive", "lane", "poke")
}
