package outbox_test

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
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

func newAdmin(t *testing.T, pool *pgxpool.Pool, schema string) *outbox.Admin {
	t.Helper()
	a, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// eventID returns the id of an aggregate's event.
func eventID(t *testing.T, pool *pgxpool.Pool, schema, aggregateID string, seq int64) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	if err := pool.QueryRow(context.Background(), `SELECT event_id FROM `+schema+`.outbox_events
		WHERE aggregate_id = $1 AND aggregate_sequence = $2`, aggregateID, seq).Scan(&id); err != nil {
		t.Fatalf("event %s #%d: %v", aggregateID, seq, err)
	}
	return id
}

// checkOrderAllowingSkips asserts I5 at the broker when operators skipped
// events: per aggregate, the first appearance of each sequence is the next
// one, or follows a run of skipped events that the message declares with
// SkippedFrom. It returns the first-appearance messages per aggregate.
func checkOrderAllowingSkips(t *testing.T, msgs []outbox.Message) map[string][]outbox.Message {
	t.Helper()
	last := map[string]int64{}
	seen := map[uuid.UUID]bool{}
	out := map[string][]outbox.Message{}
	for _, m := range msgs {
		if seen[m.ID] || m.ReplayID != uuid.Nil {
			continue
		}
		seen[m.ID] = true
		key := m.AggregateType + "/" + m.AggregateID
		want := last[key] + 1
		if m.Sequence != want && (m.SkippedFrom == 0 || m.SkippedFrom > want || m.Sequence < want) {
			t.Fatalf("I5 violated: aggregate %s: sequence %d (skipped from %d) reached the broker after %d", key, m.Sequence, m.SkippedFrom, last[key])
		}
		last[key] = m.Sequence
		out[key] = append(out[key], m)
	}
	return out
}

// TestQuarantineBlocksOnlyItsAggregateThenSkip: a permanent failure
// quarantines one event; only its aggregate waits (visibly: list, status);
// skipping it (reason and actor recorded) lets the aggregate's later events
// out, carrying SkippedFrom, and an inbox applies them without a gap. A
// second skip in a row extends the skipped run.
func TestQuarantineBlocksOnlyItsAggregateThenSkip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	admin := newAdmin(t, pool, schema)
	var attempts sync.Map // event id -> attempts seen by the destination
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		n, _ := attempts.LoadOrStore(m.ID, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if m.AggregateID == "agg-1" && (m.Sequence == 2 || m.Sequence == 3) {
			return outbox.Permanent(fmt.Errorf("schema registry refused %s #%d", m.AggregateID, m.Sequence))
		}
		return nil
	}}
	writeEvents(t, pool, w, 3, 5) // agg-0..agg-2, sequences 1..5
	startRelay(t, pool, quietConfig(schema, pub))

	outboxtest.Eventually(t, 30*time.Second, "agg-0 and agg-2 drained, agg-1/2 quarantined", func() bool {
		st, err := admin.Status(ctx)
		return err == nil && st.Quarantined == 1 && st.Pending == 3
	})
	st, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.BlockedByQuarantine != 3 || st.Leased != 0 || len(st.AggregateTypes) != 1 || st.AggregateTypes[0].Quarantined != 1 {
		t.Fatalf("status %+v: want 3 blocked, none leased, one aggregate type with 1 quarantined", st)
	}
	if st.RelaysAlive != 1 || len(st.Relays) != 1 {
		t.Fatalf("status shows %d relays alive (%v), want the running one", st.RelaysAlive, st.Relays)
	}
	q, err := admin.ListQuarantined(ctx, outbox.QuarantineFilter{})
	if err != nil {
		t.Fatal(err)
	}
	poison := eventID(t, pool, schema, "agg-1", 2)
	if len(q) != 1 || q[0].ID != poison || q[0].Blocked != 3 || q[0].Attempts != 1 || q[0].LastError == "" {
		t.Fatalf("quarantine list %+v: want agg-1 #2 with 3 blocked, 1 attempt and its error", q)
	}
	for seq := int64(3); seq <= 5; seq++ {
		if n, ok := attempts.Load(eventID(t, pool, schema, "agg-1", seq)); ok {
			t.Fatalf("agg-1 #%d reached the destination %d times while #2 was quarantined", seq, n.(*atomic.Int64).Load())
		}
	}

	// Skip #2: #3 goes out (and is quarantined in turn), skip it too: #4
	// and #5 go out, #4 declaring that 2..3 were skipped.
	if _, err := admin.Skip(ctx, poison, "alice", "payload rejected by the registry; data fixed in INC-42"); err != nil {
		t.Fatal(err)
	}
	second := eventID(t, pool, schema, "agg-1", 3)
	outboxtest.Eventually(t, 30*time.Second, "agg-1 #3 quarantined after the skip", func() bool {
		e, err := admin.Event(ctx, second)
		return err == nil && e.State() == "quarantined"
	})
	skipped, err := admin.Skip(ctx, second, "bob", "same poison")
	if err != nil {
		t.Fatal(err)
	}
	if skipped.State() != "skipped" || skipped.SkippedBy != "bob" || skipped.SkipReason != "same poison" || skipped.SkippedAt == nil {
		t.Fatalf("skipped event %+v: want who, why and when recorded", skipped)
	}
	outboxtest.Eventually(t, 30*time.Second, "agg-1 drained after the skips", func() bool { return unpublished(t, pool, schema) == 0 })

	lanes := checkOrderAllowingSkips(t, b.streamEvents(t))
	var seqs []int64
	for _, m := range lanes["order/agg-1"] {
		seqs = append(seqs, m.Sequence)
		if m.Sequence == 4 && m.SkippedFrom != 2 {
			t.Fatalf("agg-1 #4 carries SkippedFrom %d, want 2", m.SkippedFrom)
		}
		if m.Sequence != 4 && m.SkippedFrom != 0 {
			t.Fatalf("agg-1 #%d carries SkippedFrom %d, want 0", m.Sequence, m.SkippedFrom)
		}
	}
	if fmt.Sprint(seqs) != "[1 4 5]" {
		t.Fatalf("agg-1 at the broker: %v, want [1 4 5] (2 and 3 skipped, never published)", seqs)
	}
	for _, agg := range []string{"order/agg-0", "order/agg-2"} {
		if len(lanes[agg]) != 5 {
			t.Fatalf("%s: %d events at the broker, want 5", agg, len(lanes[agg]))
		}
	}

	// An inbox applies the stream with no gap left open.
	in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "audit"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range b.streamEvents(t) {
		out, err := in.Handle(ctx, m, func(context.Context, pgx.Tx) error { return nil })
		if err != nil || out != inbox.Applied {
			t.Fatalf("inbox on %s #%d: %v, %v; want applied", m.AggregateID, m.Sequence, out, err)
		}
	}

	var ops int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_operations WHERE action = 'skip'
		AND ((actor = 'alice' AND event_id = $1) OR (actor = 'bob' AND event_id = $2)) AND reason <> ''`, poison, second).Scan(&ops); err != nil || ops != 2 {
		t.Fatalf("%d skip operations logged (err %v), want 2", ops, err)
	}
	st, err = admin.Status(ctx)
	if err != nil || len(st.RecentOperations) != 2 || st.RecentOperations[0].Actor != "bob" {
		t.Fatalf("recent operations %+v (err %v): want bob's skip first", st.RecentOperations, err)
	}
}

// TestRetryReturnsEventToItsLane: events quarantined after too many
// retryable failures are retried once the fault is fixed; they go out in
// order, with attempts reset.
func TestRetryReturnsEventToItsLane(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	admin := newAdmin(t, pool, schema)
	var fixed atomic.Bool
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "agg-0" && !fixed.Load() {
			return errors.New("consumer schema mismatch")
		}
		return nil
	}}
	writeEvents(t, pool, w, 2, 3)
	cfg := quietConfig(schema, pub)
	cfg.MaxAttempts = 2
	cfg.RetryBackoffMin, cfg.RetryBackoffMax = 5*time.Millisecond, 5*time.Millisecond
	startRelay(t, pool, cfg)
	head := eventID(t, pool, schema, "agg-0", 1)
	outboxtest.Eventually(t, 30*time.Second, "agg-0 #1 quarantined after 2 attempts, agg-1 drained", func() bool {
		e, err := admin.Event(ctx, head)
		return err == nil && e.State() == "quarantined" && unpublished(t, pool, schema) == 3
	})
	fixed.Store(true)
	before, err := admin.Retry(ctx, head, "carol")
	if err != nil {
		t.Fatal(err)
	}
	if before.Attempts != 2 || before.LastError != "consumer schema mismatch" {
		t.Fatalf("retry returned %+v: want the event as quarantined, 2 attempts and its error", before)
	}
	outboxtest.Eventually(t, 30*time.Second, "agg-0 drained after the retry", func() bool { return unpublished(t, pool, schema) == 0 })
	lanes := checkOrderAllowingSkips(t, b.streamEvents(t))
	if len(lanes["order/agg-0"]) != 3 || len(lanes["order/agg-1"]) != 3 {
		t.Fatalf("at the broker: %d and %d events, want 3 and 3", len(lanes["order/agg-0"]), len(lanes["order/agg-1"]))
	}
	after, err := admin.Event(ctx, head)
	if err != nil || after.State() != "published" || after.Attempts != 0 {
		t.Fatalf("after the retry: %+v (err %v), want published with attempts reset", after, err)
	}
}

// TestAdminRefusesBadRequests: unknown ids, events that are not
// quarantined, a skip without a reason or an actor.
func TestAdminRefusesBadRequests(t *testing.T) {
	t.Parallel()
	forAdminKinds(t, testAdminRefusesBadRequests)
}

func testAdminRefusesBadRequests(t *testing.T, k adminKind) {
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	admin := k.newAdmin(t, pool, schema)
	recs := writeEvents(t, pool, newWriter(t, schema), 1, 1)
	pending := recs[0].ID
	unknown := uuid.New()
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"retry unknown", second(admin.Retry(ctx, unknown, "op")), outbox.ErrEventNotFound},
		{"skip unknown", second(admin.Skip(ctx, unknown, "op", "why")), outbox.ErrEventNotFound},
		{"retry pending", second(admin.Retry(ctx, pending, "op")), outbox.ErrNotQuarantined},
		{"skip pending", second(admin.Skip(ctx, pending, "op", "why")), outbox.ErrNotQuarantined},
		{"skip without reason", second(admin.Skip(ctx, pending, "op", "")), outbox.ErrReasonRequired},
		{"skip without actor", second(admin.Skip(ctx, pending, "", "why")), outbox.ErrActorRequired},
		{"retry without actor", second(admin.Retry(ctx, pending, "")), outbox.ErrActorRequired},
		{"replay without actor", second(admin.Replay(ctx, outbox.PublisherFunc(nil), outbox.ReplayConfig{})), outbox.ErrActorRequired},
		{"cleanup without horizon", second(admin.Cleanup(ctx, outbox.CleanupConfig{})), nil},
		{"cleanup negative", second(admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: -time.Hour})), nil},
		{"inbox horizon too short", second(admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: time.Hour, InboxOlderThan: time.Minute})), outbox.ErrInboxHorizon},
	} {
		if c.err == nil || (c.want != nil && !errors.Is(c.err, c.want)) {
			t.Errorf("%s: error %v, want %v", c.name, c.err, c.want)
		}
	}
	e, err := admin.Event(ctx, pending)
	if err != nil || e.State() != "pending" {
		t.Fatalf("the pending event changed: %+v, %v", e, err)
	}
	if _, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: outbox.PublisherFunc(nil), Observer: struct{}{}}); err == nil {
		t.Fatal("NewRelay accepted an observer that implements no observer interface")
	}
	if _, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: outbox.PublisherFunc(nil),
		Cleanup: outbox.CleanupConfig{OlderThan: time.Hour, InboxOlderThan: time.Minute}}); !errors.Is(err, outbox.ErrInboxHorizon) {
		t.Fatalf("NewRelay with an inbox horizon under the replay horizon: %v, want ErrInboxHorizon", err)
	}
}

func second[T any](_ T, err error) error { return err }

// seedCleanupRows writes rows in every state clean-up must tell apart, and
// returns the ids that must survive a clean-up with a 1h horizon and the
// number of rows it must delete (events, inbox rows).
func seedCleanupRows(t testing.TB, pool *pgxpool.Pool, schema string, old int) (keep []uuid.UUID, keepInbox int) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at, published_at)
SELECT gen_random_uuid(), 'order', 'old-' || i, 1, 'Old', '{}', now() - interval '3 hours', now() - interval '2 hours'
FROM generate_series(1, $1) i;
`, old)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `
INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload,
	occurred_at, published_at, quarantined_at, claimed_by, claim_token, claim_until)
VALUES
	-- published inside the horizon
	(gen_random_uuid(), 'order', 'recent', 1, 'Recent', '{}', now() - interval '3 hours', now() - interval '30 minutes', NULL, NULL, NULL, NULL),
	-- unpublished, very old
	(gen_random_uuid(), 'order', 'stuck', 1, 'Stuck', '{}', now() - interval '30 days', NULL, NULL, NULL, NULL, NULL),
	-- quarantined, very old
	(gen_random_uuid(), 'order', 'poison', 1, 'Poison', '{}', now() - interval '30 days', NULL, now() - interval '29 days', NULL, NULL, NULL),
	-- leased by a relay, old
	(gen_random_uuid(), 'order', 'leased', 1, 'Leased', '{}', now() - interval '30 days', NULL, NULL, 'r', gen_random_uuid(), now() + interval '1 minute')
RETURNING event_id`)
	if err != nil {
		t.Fatal(err)
	}
	keep, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	// Old skipped events: one whose successor is still pending (kept: the
	// successor's claim reads its skipped_from), one whose successor was
	// published before the others (deleted in the first batch, so the skipped
	// one goes in a later batch; both counted among the old ones by the
	// caller).
	var skippedKept uuid.UUID
	if err := pool.QueryRow(ctx, `
WITH rows AS (
	INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload,
		occurred_at, quarantined_at, published_at, skipped_at, skipped_by, skip_reason, skipped_from)
	VALUES
		(gen_random_uuid(), 'order', 'skip-waiting', 1, 'Poison', '{}', now() - interval '3 hours', now() - interval '3 hours',
			now() - interval '2 hours', now() - interval '2 hours', 'op', 'why', 1),
		(gen_random_uuid(), 'order', 'skip-waiting', 2, 'Next', '{}', now() - interval '3 hours', NULL, NULL, NULL, NULL, NULL, NULL),
		(gen_random_uuid(), 'order', 'old-skip', 1, 'Poison', '{}', now() - interval '3 hours', now() - interval '3 hours',
			now() - interval '2 hours', now() - interval '2 hours', 'op', 'why', 1),
		(gen_random_uuid(), 'order', 'old-skip', 2, 'Next', '{}', now() - interval '3 hours', NULL, now() - interval '130 minutes', NULL, NULL, NULL, NULL)
	RETURNING event_id, aggregate_id, aggregate_sequence), counters AS (
	-- the counter rows a writer leaves: a skipped event goes only once its
	-- successor was written and is gone
	INSERT INTO `+schema+`.outbox_aggregates (aggregate_type, aggregate_id, last_sequence)
	VALUES ('order', 'skip-waiting', 2), ('order', 'old-skip', 2))
SELECT event_id FROM rows WHERE aggregate_id = 'skip-waiting' AND aggregate_sequence = 1`).Scan(&skippedKept); err != nil {
		t.Fatal(err)
	}
	keep = append(keep, skippedKept)
	if _, err := pool.Exec(ctx, `
INSERT INTO `+schema+`.processed_events (consumer_name, event_id, processed_at)
SELECT 'c', gen_random_uuid(), now() - interval '3 hours' FROM generate_series(1, $1)`, old); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO `+schema+`.processed_events (consumer_name, event_id, processed_at)
SELECT 'c', gen_random_uuid(), now() - interval '10 minutes' FROM generate_series(1, 3);
INSERT INTO `+schema+`.inbox_aggregates (consumer_name, aggregate_type, aggregate_id, last_sequence, updated_at)
VALUES ('c', 'order', 'old-1', 1, now() - interval '30 days');`); err != nil {
		t.Fatal(err)
	}
	return keep, 3
}

// checkCleanupSurvivors asserts that every protected row is still there and
// returns how many old published events and old inbox rows are left.
func checkCleanupSurvivors(t testing.TB, pool *pgxpool.Pool, schema string, keep []uuid.UUID, keepInbox int) (oldEvents, oldInbox int) {
	t.Helper()
	var kept, recentInbox, marks int
	if err := pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM `+schema+`.outbox_events WHERE event_id = ANY($1)),
		(SELECT count(*) FROM `+schema+`.outbox_events WHERE aggregate_id LIKE 'old-%'),
		(SELECT count(*) FROM `+schema+`.processed_events WHERE processed_at > now() - interval '1 hour'),
		(SELECT count(*) FROM `+schema+`.processed_events WHERE processed_at < now() - interval '1 hour'),
		(SELECT count(*) FROM `+schema+`.inbox_aggregates)`, keep).Scan(&kept, &oldEvents, &recentInbox, &oldInbox, &marks); err != nil {
		t.Fatal(err)
	}
	if kept != len(keep) || recentInbox != keepInbox || marks != 1 {
		t.Fatalf("clean-up deleted protected rows: %d of %d unpublished/quarantined/leased/in-horizon events left, %d of %d recent inbox rows, %d of 1 high-water marks",
			kept, len(keep), recentInbox, keepInbox, marks)
	}
	return oldEvents, oldInbox
}

type cleanupCounter struct{ events, inbox atomic.Int64 }

func (c *cleanupCounter) ObserveCleanup(o outbox.CleanupObservation) {
	if o.Table == "outbox_events" {
		c.events.Add(int64(o.Deleted))
	} else {
		c.inbox.Add(int64(o.Deleted))
	}
}

// TestCleanupDeletesOnlySettledRowsPastTheHorizon, through Admin.Cleanup in
// small batches, then through the relay's periodic clean-up.
func TestCleanupDeletesOnlySettledRowsPastTheHorizon(t *testing.T) {
	t.Parallel()
	forAdminKinds(t, testCleanupDeletesOnlySettledRowsPastTheHorizon)
}

func testCleanupDeletesOnlySettledRowsPastTheHorizon(t *testing.T, k adminKind) {
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	keep, keepInbox := seedCleanupRows(t, pool, schema, 25)
	var obs cleanupCounter
	admin := k.newAdminWith(t, pool, outbox.AdminConfig{Tables: outbox.Schema(schema), Observer: &obs})
	var progress []outbox.CleanupProgress
	res, err := admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: time.Hour, InboxOlderThan: time.Hour, BatchSize: 10,
		Progress: func(p outbox.CleanupProgress) { progress = append(progress, p) }})
	if err != nil {
		t.Fatal(err)
	}
	oldEvents, oldInbox := checkCleanupSurvivors(t, pool, schema, keep, keepInbox)
	if res.Events != 27 || res.InboxRows != 25 || oldEvents != 0 || oldInbox != 0 {
		t.Fatalf("clean-up deleted %d events and %d inbox rows (left %d, %d), want 27 and 25", res.Events, res.InboxRows, oldEvents, oldInbox)
	}
	// 27 events in batches of 10: 10, 10, 7; 25 inbox rows: 10, 10, 5.
	if len(progress) != 6 || progress[2].Total != 27 || res.Batches != 6 || obs.events.Load() != 27 || obs.inbox.Load() != 25 {
		t.Fatalf("progress %+v, %d batches, observed %d/%d: want 3 batches per table", progress, res.Batches, obs.events.Load(), obs.inbox.Load())
	}

	// The relay's periodic clean-up does the same.
	pool2, schema2 := outboxtest.Schema(t)
	keep2, keepInbox2 := seedCleanupRows(t, pool2, schema2, 7)
	var obs2 cleanupCounter
	cfg := quietConfig(schema2, outbox.PublisherFunc(func(context.Context, []outbox.Message) []error { return nil }))
	cfg.Observer = &obs2
	cfg.Cleanup = outbox.CleanupConfig{OlderThan: time.Hour, InboxOlderThan: 2 * time.Hour, BatchSize: 3}
	cfg.CleanupInterval = 10 * time.Millisecond
	startRelay(t, pool2, cfg)
	// The relay publishes the pending successor of the waiting skipped
	// event; the skipped one stays while that successor is in the table (a
	// replay of it needs the skip marker): 7 + 2.
	outboxtest.Eventually(t, 30*time.Second, "relay cleaned up", func() bool { return obs2.events.Load() == 9 && obs2.inbox.Load() == 7 })
	if oldEvents, oldInbox := checkCleanupSurvivors(t, pool2, schema2, keep2, keepInbox2); oldEvents != 0 || oldInbox != 0 {
		t.Fatalf("relay clean-up left %d old events and %d old inbox rows", oldEvents, oldInbox)
	}
}

// TestReplayOrderAndIDs replays a filtered set of published events: they
// reach the broker again with their original ids, a replay id, and in
// sequence order per aggregate; skipped events are not replayed; the
// outbox rows are untouched.
func TestReplayOrderAndIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), time.Hour) // a long dedup window: the replay must not be dropped
	admin := newAdmin(t, pool, schema)
	recs := writeEvents(t, pool, w, 4, 6)
	// agg-3 #2 is quarantined and skipped: never published, never replayed.
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "agg-3" && m.Sequence == 2 {
			return outbox.Permanent(errors.New("refused"))
		}
		return nil
	}}
	_, stop := startRelay(t, pool, quietConfig(schema, pub))
	outboxtest.Eventually(t, 30*time.Second, "agg-3 #2 quarantined", func() bool {
		e, err := admin.Event(ctx, eventID(t, pool, schema, "agg-3", 2))
		return err == nil && e.State() == "quarantined"
	})
	if _, err := admin.Skip(ctx, eventID(t, pool, schema, "agg-3", 2), "test", "refused by the broker"); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "all published", func() bool { return unpublished(t, pool, schema) == 0 })
	stop()
	before := len(b.streamEvents(t))

	// Replay agg-1 entirely, and agg-3 (with its skip), in small pages.
	var progress []outbox.ReplayProgress
	for _, agg := range []string{"agg-1", "agg-3"} {
		res, err := admin.Replay(ctx, b.pub, outbox.ReplayConfig{AggregateType: "order", AggregateID: agg, By: "test", BatchSize: 4,
			Progress: func(p outbox.ReplayProgress) { progress = append(progress, p) }})
		if err != nil {
			t.Fatal(err)
		}
		want := int64(6)
		if agg == "agg-3" {
			want = 5
		}
		if res.Events != want || res.Aggregates != 1 {
			t.Fatalf("replay of %s: %d events of %d aggregates, want %d of 1", agg, res.Events, res.Aggregates, want)
		}
	}
	// A time range: events that occurred from the 3rd round on, all aggregates.
	since := recs[2*4].OccurredAt
	res, err := admin.Replay(ctx, b.pub, outbox.ReplayConfig{Since: since, Until: time.Now().Add(time.Hour), By: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Events != 4*4 || res.Aggregates != 4 {
		t.Fatalf("replay since round 3: %d events of %d aggregates, want 16 of 4", res.Events, res.Aggregates)
	}
	if len(progress) < 3 || progress[len(progress)-1].Replayed != progress[len(progress)-1].Total {
		t.Fatalf("progress %+v: want several reports ending at the total", progress)
	}

	all := b.streamEvents(t)
	byReplay := map[uuid.UUID][]outbox.Message{}
	var replayOrder []uuid.UUID
	for _, m := range all[before:] {
		if m.ReplayID == uuid.Nil {
			t.Fatalf("a message without a replay id reached the stream during the replays: %+v", m)
		}
		if _, ok := byReplay[m.ReplayID]; !ok {
			replayOrder = append(replayOrder, m.ReplayID)
		}
		byReplay[m.ReplayID] = append(byReplay[m.ReplayID], m)
	}
	if len(replayOrder) != 3 {
		t.Fatalf("%d replay ids on the stream, want 3", len(replayOrder))
	}
	original := map[uuid.UUID]outbox.Message{}
	for _, m := range all[:before] {
		original[m.ID] = m
	}
	for i, rid := range replayOrder {
		last := map[string]int64{}
		for _, m := range byReplay[rid] {
			o, ok := original[m.ID]
			if !ok {
				t.Fatalf("replay %d sent event %s, which was never published", i, m.ID)
			}
			if o.AggregateID != m.AggregateID || o.Sequence != m.Sequence || string(o.Payload) != string(m.Payload) || o.SkippedFrom != m.SkippedFrom {
				t.Fatalf("replayed event %s differs from the original: %+v vs %+v", m.ID, m, o)
			}
			if m.Sequence <= last[m.AggregateID] {
				t.Fatalf("replay %d: %s #%d after #%d", i, m.AggregateID, m.Sequence, last[m.AggregateID])
			}
			last[m.AggregateID] = m.Sequence
		}
	}
	if n := len(byReplay[replayOrder[0]]); n != 6 {
		t.Fatalf("first replay sent %d messages, want agg-1's 6", n)
	}
	var replays int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_operations WHERE action = 'replay' AND detail->>'outcome' = 'done'`).Scan(&replays); err != nil || replays != 3 {
		t.Fatalf("%d replays recorded as done (err %v), want 3", replays, err)
	}
	// Nothing in the outbox changed.
	if unpublished(t, pool, schema) != 0 {
		t.Fatal("replay changed the outbox")
	}
}
