package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// startBundle is an inbox over a schema of its own, with an effects table and
// the inbox Admin.
type startBundle struct {
	kind   txKind
	pool   *pgxpool.Pool
	schema string
	in     *inbox.Inbox
	admin  *inbox.Admin
}

// setupStart is setupStartKind on pgx.
func setupStart(t *testing.T, cfg inbox.Config) *startBundle {
	t.Helper()
	return setupStartKind(t, txKinds[0], cfg)
}

// setupStartKind is a bundle whose inbox and Admin run on transactions of
// kind k.
func setupStartKind(t *testing.T, k txKind, cfg inbox.Config) *startBundle {
	t.Helper()
	pool, schema := outboxtest.Schema(t)
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+schema+".effects (event_id uuid, seq bigint)"); err != nil {
		t.Fatal(err)
	}
	cfg.Schema = schema
	if cfg.Consumer == "" {
		cfg.Consumer = "c1"
	}
	in := k.newInbox(t, pool, cfg)
	admin := k.newAdmin(t, pool, inbox.AdminConfig{Tables: outbox.Schema(schema)})
	return &startBundle{kind: k, pool: pool, schema: schema, in: in, admin: admin}
}

func (b *startBundle) deliver(t *testing.T, m outbox.Message, want inbox.Outcome) {
	t.Helper()
	got, err := b.kind.handle(context.Background(), b.in, m, func(ctx context.Context, exec execFunc) error {
		return exec(ctx, "INSERT INTO "+b.schema+".effects VALUES ($1, $2)", m.ID, m.Sequence)
	})
	if err != nil || got != want {
		t.Fatalf("deliver %s #%d: %v, %v; want %v", m.AggregateID, m.Sequence, got, err, want)
	}
}

// effects returns the sequences applied to aggregate id, in order.
func (b *startBundle) effects(t *testing.T) []int64 {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT seq FROM "+b.schema+".effects ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return seqs
}

func (b *startBundle) aggregate(t *testing.T, id string) inbox.AggregateInfo {
	t.Helper()
	a, err := b.admin.Aggregate(context.Background(), b.in.Consumer(), "order", id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func equalSeqs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestStartAtFirstSeen is a consumer that joins the stream mid-way: for
// each aggregate it never saw, the first event delivered is applied and the
// start recorded; after that, the aggregate is as strict as ever.
func TestStartAtFirstSeen(t *testing.T) {
	t.Parallel()
	forKinds(t, testStartAtFirstSeen)
}

func testStartAtFirstSeen(t *testing.T, k txKind) {
	b := setupStartKind(t, k, inbox.Config{StartAtFirstSeen: true, StartReason: "billing v2 deployed; history not needed"})
	before := time.Now().Add(-time.Minute)

	b.deliver(t, msg("o1", 5), inbox.Applied)
	b.deliver(t, msg("o1", 4), inbox.Duplicate) // below the start: never applied
	b.deliver(t, msg("o1", 6), inbox.Applied)
	b.deliver(t, msg("o1", 8), inbox.Early) // a gap after the start is still a gap
	b.deliver(t, msg("o2", 1), inbox.Applied)
	if got := b.effects(t); !equalSeqs(got, []int64{1, 5, 6}) {
		t.Fatalf("effects %v, want [1 5 6]", got)
	}

	o1 := b.aggregate(t, "o1")
	s := o1.Start
	if o1.LastSequence != 6 || s == nil || s.Kind != inbox.StartFirstSeen || s.PriorMark != 0 || s.Mark != 4 ||
		s.Reason != "billing v2 deployed; history not needed" || s.By != "" || s.At.Before(before) {
		t.Fatalf("o1 after a first-seen start: %+v, start %+v; want mark 6, start first_seen 0 -> 4 with the configured reason", o1, s)
	}
	// The start is durable, in plain columns an operator can query.
	var kind string
	var mark int64
	if err := b.pool.QueryRow(context.Background(), `SELECT start_kind, start_mark FROM `+b.schema+`.inbox_aggregates
		WHERE consumer_name = 'c1' AND aggregate_id = 'o1'`).Scan(&kind, &mark); err != nil || kind != "first_seen" || mark != 4 {
		t.Fatalf("start columns %q %d, %v", kind, mark, err)
	}
	// An aggregate that started at sequence 1 started normally: nothing
	// recorded.
	if o2 := b.aggregate(t, "o2"); o2.Start != nil || o2.LastSequence != 1 {
		t.Fatalf("o2 %+v start %+v, want mark 1 and no start", o2, o2.Start)
	}

	// A consumer that ran strict first (its aggregate waiting) and then
	// restarts with StartAtFirstSeen starts that aggregate too, ending its
	// wait; the default reason is recorded.
	noEffect := func(context.Context, execFunc) error { return nil }
	strict := k.newInbox(t, b.pool, inbox.Config{Schema: b.schema, Consumer: "c2"})
	m := msg("o3", 7)
	if got, err := k.handle(context.Background(), strict, m, noEffect); err != nil || got != inbox.Early {
		t.Fatalf("strict consumer, first event #7: %v, %v; want early", got, err)
	}
	lenient := k.newInbox(t, b.pool, inbox.Config{Schema: b.schema, Consumer: "c2", StartAtFirstSeen: true})
	if got, err := k.handle(context.Background(), lenient, m, noEffect); err != nil || got != inbox.Applied {
		t.Fatalf("restarted with StartAtFirstSeen, #7: %v, %v; want applied", got, err)
	}
	o3, err := b.admin.Aggregate(context.Background(), "c2", "order", "o3")
	if err != nil || o3.Wait != nil || o3.Start == nil || o3.Start.Mark != 6 || o3.Start.Reason != inbox.StartReasonDefault {
		t.Fatalf("o3 %+v (start %+v, wait %+v), %v; want started at 6 with the default reason, no wait", o3, o3.Start, o3.Wait, err)
	}
}

// TestDefaultStaysStrict: without StartAtFirstSeen nothing starts mid-stream;
// a first event past 1 is Early however often it comes, and no start is
// recorded.
func TestDefaultStaysStrict(t *testing.T) {
	t.Parallel()
	b := setupStart(t, inbox.Config{})
	for range 3 {
		b.deliver(t, msg("o1", 5), inbox.Early)
	}
	if got := b.effects(t); len(got) != 0 {
		t.Fatalf("effects %v, want none", got)
	}
	if o1 := b.aggregate(t, "o1"); o1.LastSequence != 0 || o1.Start != nil || o1.Wait == nil {
		t.Fatalf("o1 %+v (start %+v, wait %+v): want mark 0, no start, waiting", o1, o1.Start, o1.Wait)
	}
}

// TestSeed sets a mark from a snapshot: the seeded aggregate accepts seed+1,
// drops what is at or below the seed as duplicates, and records the seed.
func TestSeed(t *testing.T) {
	t.Parallel()
	forKinds(t, testSeed)
}

func testSeed(t *testing.T, k txKind) {
	ctx := context.Background()
	b := setupStartKind(t, k, inbox.Config{})

	// Seeded in the caller's transaction with its snapshot: a rollback
	// leaves no mark.
	boom := errors.New("snapshot restore failed")
	err := k.inTx(ctx, t, b.pool, func(tx callerTx) error {
		if err := tx.seed(ctx, b.in, "order", "o1", 10, "restored from snapshot S-1"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if last, err := b.in.LastSequence(ctx, "order", "o1"); err != nil || last != 0 {
		t.Fatalf("after a rolled-back seed, mark %d, %v; want 0", last, err)
	}
	err = k.inTx(ctx, t, b.pool, func(tx callerTx) error {
		if err := tx.exec(ctx, "INSERT INTO "+b.schema+".effects VALUES (gen_random_uuid(), 0)"); err != nil { // the snapshot's state
			return err
		}
		return tx.seed(ctx, b.in, "order", "o1", 10, "restored from snapshot S-1")
	})
	if err != nil {
		t.Fatal(err)
	}

	b.deliver(t, msg("o1", 10), inbox.Duplicate)
	b.deliver(t, msg("o1", 3), inbox.Duplicate)
	b.deliver(t, msg("o1", 12), inbox.Early)
	b.deliver(t, msg("o1", 11), inbox.Applied)
	b.deliver(t, msg("o1", 12), inbox.Applied)
	if got := b.effects(t); !equalSeqs(got, []int64{0, 11, 12}) {
		t.Fatalf("effects %v, want the snapshot's [0] then 11 and 12", got)
	}
	o1 := b.aggregate(t, "o1")
	if s := o1.Start; s == nil || s.Kind != inbox.StartSeeded || s.PriorMark != 0 || s.Mark != 10 || s.Reason != "restored from snapshot S-1" || o1.Wait != nil {
		t.Fatalf("o1 %+v start %+v wait %+v; want seeded 0 -> 10 and no wait", o1, o1.Start, o1.Wait)
	}

	// A mark never goes back; the same mark is a no-op; a reason is required.
	if err := b.in.Seed(ctx, "order", "o1", 11, "older snapshot"); !errors.Is(err, inbox.ErrMarkAhead) {
		t.Fatalf("seed below the mark: %v, want ErrMarkAhead", err)
	}
	if err := b.in.Seed(ctx, "order", "o1", 12, "same"); err != nil {
		t.Fatalf("seed at the mark: %v", err)
	}
	if err := b.in.Seed(ctx, "order", "o2", 4, ""); !errors.Is(err, inbox.ErrReasonRequired) {
		t.Fatalf("seed without reason: %v", err)
	}
	if s := b.aggregate(t, "o1").Start; s.Mark != 10 || s.Reason != "restored from snapshot S-1" {
		t.Fatalf("the refused and no-op seeds changed the start: %+v", s)
	}
	// Seeding a waiting aggregate past its gap ends the wait.
	b.deliver(t, msg("o3", 4), inbox.Early)
	if err := b.in.Seed(ctx, "order", "o3", 3, "events 1-3 recovered from the archive"); err != nil {
		t.Fatal(err)
	}
	if o3 := b.aggregate(t, "o3"); o3.Wait != nil || o3.Start == nil || o3.Start.Mark != 3 {
		t.Fatalf("o3 after its seed: %+v wait %+v start %+v", o3, o3.Wait, o3.Start)
	}
	b.deliver(t, msg("o3", 4), inbox.Applied)
}

// TestEarlyRecordsTheWait: the first early delivery records since when the
// aggregate waits and for which sequence; redeliveries do not move it, a
// lower sequence seen lowers "seen", and applying clears it.
func TestEarlyRecordsTheWait(t *testing.T) {
	t.Parallel()
	forKinds(t, testEarlyRecordsTheWait)
}

func testEarlyRecordsTheWait(t *testing.T, k txKind) {
	ctx := context.Background()
	b := setupStartKind(t, k, inbox.Config{})
	b.deliver(t, msg("o1", 1), inbox.Applied)
	if o1 := b.aggregate(t, "o1"); o1.Wait != nil {
		t.Fatalf("o1 waits %+v before any gap", o1.Wait)
	}
	b.deliver(t, msg("o1", 5), inbox.Early)
	w := b.aggregate(t, "o1").Wait
	if w == nil || w.Expected != 2 || w.Seen != 5 {
		t.Fatalf("wait %+v, want expected 2, seen 5", w)
	}
	since := w.Since
	b.deliver(t, msg("o1", 6), inbox.Early)
	b.deliver(t, msg("o1", 4), inbox.Early)
	if w := b.aggregate(t, "o1").Wait; w == nil || !w.Since.Equal(since) || w.Expected != 2 || w.Seen != 4 {
		t.Fatalf("wait after redeliveries %+v; want since %v unchanged, seen lowered to 4", w, since)
	}

	rep, err := b.admin.Waiting(ctx, inbox.WaitingFilter{})
	if err != nil || len(rep.Consumers) != 1 || rep.Consumers[0].Consumer != "c1" || rep.Consumers[0].Waiting != 1 ||
		len(rep.Aggregates) != 1 || rep.Aggregates[0].AggregateID != "o1" {
		t.Fatalf("Waiting = %+v, %v", rep, err)
	}
	gauges, err := b.admin.Gauges(ctx)
	if err != nil || len(gauges) != 1 || gauges[0].Waiting != 1 || gauges[0].OldestWaitSeconds < 0 {
		t.Fatalf("Gauges = %+v, %v", gauges, err)
	}

	b.deliver(t, msg("o1", 2), inbox.Applied) // the gap closes, one event at a time
	if w := b.aggregate(t, "o1").Wait; w != nil {
		t.Fatalf("still waiting %+v after an event was applied", w)
	}
	gauges, err = b.admin.Gauges(ctx)
	if err != nil || len(gauges) != 1 || gauges[0].Consumer != "c1" || gauges[0].Waiting != 0 || gauges[0].OldestWaitSeconds != 0 {
		t.Fatalf("Gauges after the wait ended = %+v, %v; want c1 with 0", gauges, err)
	}
	b.deliver(t, msg("o1", 4), inbox.Early) // 3 still missing: a new wait
	if w := b.aggregate(t, "o1").Wait; w == nil || w.Expected != 3 || w.Seen != 4 || !w.Since.After(since) {
		t.Fatalf("new wait %+v, want expected 3, seen 4, later than the first", w)
	}
}

// TestResolve moves a stuck aggregate past its gap: the waiting event is
// applied at its next delivery, the resolve is recorded on the mark and in
// the audit log, and what makes no sense is refused.
func TestResolve(t *testing.T) {
	t.Parallel()
	forKinds(t, testResolve)
}

func testResolve(t *testing.T, k txKind) {
	ctx := context.Background()
	b := setupStartKind(t, k, inbox.Config{})
	b.deliver(t, msg("o1", 1), inbox.Applied)
	b.deliver(t, msg("o1", 2), inbox.Applied)
	b.deliver(t, msg("o1", 6), inbox.Early)
	b.deliver(t, msg("o1", 5), inbox.Early) // 3 and 4 were lost by the broker

	r := inbox.Resolution{Consumer: "c1", AggregateType: "order", AggregateID: "o1", By: "alice", Reason: "3-4 lost to stream retention; INC-9"}
	for _, c := range []struct {
		change func(*inbox.Resolution)
		want   error
	}{
		{func(r *inbox.Resolution) { r.Reason = "" }, inbox.ErrReasonRequired},
		{func(r *inbox.Resolution) { r.By = "" }, inbox.ErrActorRequired},
		{func(r *inbox.Resolution) { r.To = 2 }, inbox.ErrMarkAhead},
		{func(r *inbox.Resolution) { r.AggregateID = "nope" }, inbox.ErrAggregateNotFound},
	} {
		bad := r
		c.change(&bad)
		if _, err := b.admin.Resolve(ctx, bad); !errors.Is(err, c.want) {
			t.Errorf("Resolve(%+v): %v, want %v", bad, err, c.want)
		}
	}
	got, err := b.admin.Resolve(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if s := got.Start; got.LastSequence != 4 || got.Wait != nil || s == nil || s.Kind != inbox.StartResolved ||
		s.PriorMark != 2 || s.Mark != 4 || s.By != "alice" || s.Reason != r.Reason {
		t.Fatalf("resolved %+v start %+v wait %+v; want mark 4 (just below the lowest seen, 5), resolved 2 -> 4 by alice", got, got.Start, got.Wait)
	}
	var ops int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.schema+`.outbox_operations
		WHERE action = 'inbox_resolve' AND actor = 'alice' AND reason = $1 AND detail->>'consumer' = 'c1'
		  AND detail->>'aggregate_id' = 'o1' AND (detail->>'prior_mark')::int = 2 AND (detail->>'mark')::int = 4
		  AND (detail->>'waiting_for')::int = 3 AND (detail->>'waiting_seen')::int = 5`, r.Reason).Scan(&ops); err != nil || ops != 1 {
		t.Fatalf("%d audit rows, %v; want 1", ops, err)
	}
	b.deliver(t, msg("o1", 5), inbox.Applied)
	b.deliver(t, msg("o1", 6), inbox.Applied)
	b.deliver(t, msg("o1", 3), inbox.Duplicate) // a late straggler of the gap
	if got := b.effects(t); !equalSeqs(got, []int64{1, 2, 5, 6}) {
		t.Fatalf("effects %v, want [1 2 5 6]", got)
	}
	if _, err := b.admin.Resolve(ctx, r); !errors.Is(err, inbox.ErrNotWaiting) {
		t.Fatalf("resolving an aggregate that does not wait: %v, want ErrNotWaiting", err)
	}
	// An explicit target sets the mark of an aggregate never seen.
	r.AggregateID, r.To = "o9", 41
	if got, err := b.admin.Resolve(ctx, r); err != nil || got.LastSequence != 41 || got.Start.PriorMark != 0 {
		t.Fatalf("Resolve to 41 of a new aggregate: %+v, %v", got, err)
	}
	b.deliver(t, msg("o9", 42), inbox.Applied)
}
