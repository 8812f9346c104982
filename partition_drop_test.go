package outbox_test

// The partition drop's hostile review (issue 21, part 1): each test here
// failed before its fix (docs/operations.md, "What the upkeep does").

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/partman"
	"github.com/pgoutbox/outbox/internal/pgtx"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

func isPartition(t *testing.T, pool *pgxpool.Pool, schema, name string) (exists, attached bool) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL,
	coalesce((SELECT relispartition FROM pg_class WHERE oid = to_regclass($1)), false)`, schema+"."+name).Scan(&exists, &attached); err != nil {
		t.Fatal(err)
	}
	return exists, attached
}

func visible(t *testing.T, pool *pgxpool.Pool, schema string, id uuid.UUID) (found, published bool) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT published_at IS NOT NULL FROM `+schema+`.outbox_events WHERE event_id = $1`, id).Scan(&published)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true, published
}

// Finding 1: a round whose second step fails after the DETACH (the
// ACCESS EXCLUSIVE check and drop errs, the connection dies) leaves the
// partition's table detached; an event committed into it between the check
// and the detach (an old id of the caller's) is there, where no relay
// reads it. The next round finds the table (its marker), attaches it again
// because it holds an unpublished event, and the relay publishes that
// event; once settled, a later round drops the partition.
func TestPartitionDetachLeftoverIsAttachedAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	s := mustSchema(t, schema)
	w := newWriter(t, schema)
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	settled, late := closedID(t, pool, schema, 1), closedID(t, pool, schema, 2)
	part := partman.Name(partman.TimeOf(settled))
	if err := insertWithID(t, pool, w, "settled", settled); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now() WHERE event_id = $1`, settled); err != nil {
		t.Fatal(err)
	}
	remove := partman.SetHook(s, func(step, p string) error {
		switch {
		case p != part:
		case step == "before-detach": // after the check through the parent
			// An upkeep of an earlier version (or on a schema before
			// migration 018) did not close the partition first: the
			// late event gets in, as it did then.
			if _, err := pool.Exec(ctx, `DROP TRIGGER IF EXISTS `+partman.ClosedName+` ON `+schema+`.`+part); err != nil {
				return err
			}
			return insertWithID(t, pool, w, "late", late)
		case step == "after-detach":
			return errors.New("injected: the connection died after the detach")
		}
		return nil
	})
	cfg := outbox.CleanupConfig{OlderThan: time.Millisecond}
	if _, err := admin.Cleanup(ctx, cfg); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("clean-up with the failing second step: %v, want the injected error", err)
	}
	remove()
	if exists, attached := isPartition(t, pool, schema, part); !exists || attached {
		t.Fatalf("after the failed round %s exists %v, attached %v: want it left detached (the state to recover from)", part, exists, attached)
	}
	if found, _ := visible(t, pool, schema, late); found {
		t.Fatal("the late event is visible through outbox_events while its table is detached")
	}

	res, err := admin.Cleanup(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if exists, attached := isPartition(t, pool, schema, part); !exists || !attached {
		t.Fatalf("after the next round (%+v) %s exists %v, attached %v: want it attached again", res, part, exists, attached)
	}
	if h := held(res, part); len(h) != 1 || h[0].Unpublished != 1 {
		t.Fatalf("clean-up %+v: want %s held by its one unpublished event", res, part)
	}
	if found, published := visible(t, pool, schema, late); !found || published {
		t.Fatalf("late event found %v, published %v: want it back, unpublished", found, published)
	}
	startRelay(t, pool, quietConfig(schema, discardPublisher{}))
	outboxtest.Eventually(t, 20*time.Second, "the relay publishes the late event", func() bool {
		_, published := visible(t, pool, schema, late)
		return published
	})
	// The relay runs the partition upkeep too (creating ahead): a round of
	// the clean-up that meets it is refused, and tried again.
	outboxtest.Eventually(t, 20*time.Second, "a clean-up round not beside the relay's upkeep", func() bool {
		res, err = admin.Cleanup(ctx, cfg)
		return !errors.Is(err, outbox.ErrUpkeepBusy)
	})
	if err != nil || !slices.Contains(res.PartitionsDropped, part) {
		t.Fatalf("clean-up %+v, %v: want %s dropped once settled", res, err, part)
	}
	if exists, _ := isPartition(t, pool, schema, part); exists {
		t.Fatalf("%s still exists", part)
	}
}

// Finding 1, the other way: a detached table left behind whose events are
// all settled and past the horizon is dropped by the next round.
func TestPartitionDetachLeftoverSettledIsDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	s := mustSchema(t, schema)
	w := newWriter(t, schema)
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	id := closedID(t, pool, schema, 1)
	part := partman.Name(partman.TimeOf(id))
	if err := insertWithID(t, pool, w, "settled", id); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now() WHERE event_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	remove := partman.SetHook(s, func(step, p string) error {
		if p == part && step == "after-detach" {
			return errors.New("injected")
		}
		return nil
	})
	cfg := outbox.CleanupConfig{OlderThan: time.Millisecond}
	if _, err := admin.Cleanup(ctx, cfg); err == nil {
		t.Fatal("clean-up with the failing second step succeeded")
	}
	remove()
	res, err := admin.Cleanup(ctx, cfg)
	if err != nil || !slices.Contains(res.PartitionsDropped, part) {
		t.Fatalf("clean-up %+v, %v: want the leftover %s dropped", res, err, part)
	}
	if exists, _ := isPartition(t, pool, schema, part); exists {
		t.Fatalf("%s still exists", part)
	}
}

// interruptDetach leaves partition part "detach pending", as a DETACH ...
// CONCURRENTLY interrupted while it waited for an older transaction does:
// the detach runs behind a reader under a statement timeout, longer each
// time until its first step got through before the timeout.
func interruptDetach(t *testing.T, pool *pgxpool.Pool, schema, part string) {
	t.Helper()
	ctx := context.Background()
	for timeout := 300 * time.Millisecond; timeout < 20*time.Second; timeout *= 2 {
		reader, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := reader.Exec(ctx, `SELECT count(*) FROM `+schema+`.outbox_events`); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, outboxtest.DatabaseURL())
		if err != nil {
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, `SET statement_timeout = '`+timeout.String()+`'`)
		if err == nil {
			_, err = conn.Exec(ctx, `ALTER TABLE `+schema+`.outbox_events DETACH PARTITION `+schema+`.`+part+` CONCURRENTLY`)
		}
		_ = conn.Close(ctx)
		_ = reader.Rollback(ctx)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
			t.Fatalf("detach behind a reader: %v, want it cancelled by the statement timeout", err)
		}
		var pending bool
		if err := pool.QueryRow(ctx, `SELECT coalesce((SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass($1)), false)`,
			schema+"."+part).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending {
			return
		}
	}
	t.Fatalf("could not leave %s detach pending", part)
}

// Finding 2: a detach interrupted while it waited leaves the partition
// "detach pending": outbox_events no longer shows its events. A relay with
// no replay horizon finishes it (FINALIZE) and attaches the partition again
// because it holds an unpublished event, which it then publishes within
// seconds (the attach makes it due); before that, status counts the event
// as pending.
func TestPartitionDetachPendingIsFinishedWithoutHorizon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	s := mustSchema(t, schema)
	w := newWriter(t, schema)
	id := closedID(t, pool, schema, 1)
	part := partman.Name(partman.TimeOf(id))
	if err := insertWithID(t, pool, w, "pending", id); err != nil {
		t.Fatal(err)
	}
	interruptDetach(t, pool, schema, part)
	parts, err := partman.List(ctx, pgtx.Pool(pool), s)
	if err != nil || len(parts) == 0 || parts[0].Name != part || !parts[0].DetachPending {
		t.Fatalf("partitions %+v, %v: want %s detach pending", parts, err, part)
	}
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	st, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 1 || st.Partitions == nil || st.Partitions.Partitions[0].Name != part ||
		!st.Partitions.Partitions[0].DetachPending || st.Partitions.Partitions[0].Unpublished != 1 {
		t.Fatalf("status: %d pending, partitions %+v; want the event of the detach-pending %s counted", st.Pending, st.Partitions, part)
	}
	startRelay(t, pool, quietConfig(schema, discardPublisher{})) // no clean-up: no horizon
	// A FINALIZE waits for every older snapshot of the database (other
	// tests' long readers): each round that gives up leaves it to the next.
	outboxtest.Eventually(t, 120*time.Second, "the relay finishes the detach and attaches the partition again", func() bool {
		exists, attached := isPartition(t, pool, schema, part)
		found, _ := visible(t, pool, schema, id)
		return exists && attached && found
	})
	// This relay ran while the event was out of outbox_events: its look's
	// low-water mark moved past the event, and its cursor had passed it
	// long before. Only a complete look (minutes) would have found it as
	// written (so it did not publish it within two minutes on a loaded
	// machine); the upkeep makes the events it attaches again due, and the
	// next claim's due scan finds it.
	attached := time.Now()
	outboxtest.Eventually(t, 30*time.Second, "the event published after the attach", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE event_id = $1 AND published_at IS NOT NULL`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	t.Logf("published %s after the attach was seen", time.Since(attached).Round(time.Millisecond))
}

// TestPartitionAttachedAgainIsPublishedByARunningRelay: a relay that ran
// while a partition was out of outbox_events (an upkeep round detached it
// and failed before dropping or attaching it again) moved its look's
// low-water mark past the partition's unpublished event, which it could not
// see, and its cursor never had it. When the next round attaches the
// partition again, the event must be published within seconds, not at the
// next complete look (five minutes by default): the attach makes its
// pending events due, and the next claim's due scan finds them. (Before,
// in three loaded runs of the pending-detach test, a relay that ran
// meanwhile had not published it two minutes after the attach.)
func TestPartitionAttachedAgainIsPublishedByARunningRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	w := newWriter(t, schema)
	id := closedID(t, pool, schema, 1)
	part := partman.Name(partman.TimeOf(id))
	if err := insertWithID(t, pool, w, "detached", id); err != nil {
		t.Fatal(err)
	}
	parts, err := partman.List(ctx, pgtx.Pool(pool), mustSchema(t, schema))
	if err != nil {
		t.Fatal(err)
	}
	var p partman.Partition
	for _, q := range parts {
		if q.Name == part {
			p = q
		}
	}
	if p.Name == "" {
		t.Fatalf("no partition %s among %+v", part, parts)
	}
	// What a round that failed after its detach leaves: the table out of
	// outbox_events, with the event in it. Its marker comes later, once
	// the relay's look has passed the event, so that no round attaches it
	// before.
	if _, err := pool.Exec(ctx, `ALTER TABLE `+schema+`.outbox_events DETACH PARTITION `+schema+`.`+part); err != nil {
		t.Fatal(err)
	}
	cfg := quietConfig(schema, discardPublisher{})
	cfg.RescanInterval = 200 * time.Millisecond // complete looks every 12 s, then 100 times their time
	r, _ := startRelay(t, pool, cfg)
	writeEventsFor(t, pool, w, "warm-up")
	outboxtest.Eventually(t, time.Minute, "the relay's look sets its low-water mark past the detached event", func() bool {
		return r.LookLow().After(partman.TimeOf(id).Add(time.Second))
	})
	if _, err := pool.Exec(ctx, `COMMENT ON TABLE `+schema+`.`+part+` IS 'outbox upkeep: detaching from outbox_events FOR VALUES FROM (''`+
		p.FromID.String()+`'') TO (''`+p.ToID.String()+`'')'`); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, time.Minute, "the relay's upkeep attaches the partition again", func() bool {
		exists, attached := isPartition(t, pool, schema, part)
		return exists && attached
	})
	seen := time.Now()
	outboxtest.Eventually(t, 5*time.Second, "the event published after the attach", func() bool {
		_, published := visible(t, pool, schema, id)
		return published
	})
	t.Logf("published %s after the attach was seen", time.Since(seen).Round(time.Millisecond))
}

// Finding 2, through `outbox cleanup` (Admin.Cleanup) with a horizon: a
// detach-pending partition whose events are all settled is finished and
// dropped.
func TestPartitionDetachPendingSettledIsDroppedByCleanup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	w := newWriter(t, schema)
	id := closedID(t, pool, schema, 1)
	part := partman.Name(partman.TimeOf(id))
	if err := insertWithID(t, pool, w, "settled", id); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now() WHERE event_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	interruptDetach(t, pool, schema, part)
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	// A FINALIZE waits for every older snapshot of the database (other
	// tests' long readers): one that gives up leaves the partition for the
	// next round.
	outboxtest.Eventually(t, 60*time.Second, "a clean-up finishes the pending detach and drops "+part, func() bool {
		res, err := admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: time.Millisecond})
		if err != nil {
			t.Fatalf("clean-up %+v: %v", res, err)
		}
		return slices.Contains(res.PartitionsDropped, part)
	})
	if exists, _ := isPartition(t, pool, schema, part); exists {
		t.Fatalf("%s still exists", part)
	}
}

// Finding 3: a DETACH ... CONCURRENTLY waits for every older transaction
// on outbox_events. Behind a long REPEATABLE READ reader, the relay's
// upkeep still creates the partitions ahead (2-second partitions, five
// ahead: without upkeep, writes are refused within twelve seconds), and
// every write goes in; once the reader ends, the partitions left detach
// pending are finished and dropped.
func TestPartitionUpkeepCreatesAheadBehindLongReader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, outboxmigrate.PartitionConfig{Interval: 2 * time.Second, Ahead: 5})
	s := mustSchema(t, schema)
	w := newWriter(t, schema)
	cfg := quietConfig(schema, discardPublisher{})
	cfg.Cleanup = outbox.CleanupConfig{OlderThan: time.Millisecond}
	cfg.PartitionsAhead = 5
	startRelay(t, pool, cfg)
	readyAhead := func() time.Duration {
		var now time.Time
		if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		parts, err := partman.List(ctx, pgtx.Pool(pool), s)
		if err != nil || len(parts) == 0 {
			t.Fatalf("partitions %v, %v", parts, err)
		}
		return parts[len(parts)-1].To.Sub(now)
	}
	outboxtest.Eventually(t, 60*time.Second, "the relay's upkeep keeps five partitions ahead", func() bool { return readyAhead() > 8*time.Second })
	reader, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reader.Rollback(ctx) }()
	if _, err := reader.Exec(ctx, `SELECT count(*) FROM `+schema+`.outbox_events`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var writes atomic.Int64
	for time.Since(start) < 14*time.Second { // longer than the partitions ahead last
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.InsertTx(ctx, tx, orderEvent("long-reader", "Tick"))
			return err
		}); err != nil {
			t.Fatalf("write %d, %s into the long reader: %v", writes.Load(), time.Since(start).Round(time.Millisecond), err)
		}
		writes.Add(1)
		time.Sleep(100 * time.Millisecond) // the pace of the writes, not a synchronisation
	}
	if ready := readyAhead(); ready < 2*time.Second {
		t.Fatalf("partitions ready %s ahead with the reader open: the upkeep stalled", ready)
	}
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 60*time.Second, "no partition left detach pending and the ones from before the reader dropped", func() bool {
		parts, err := partman.List(ctx, pgtx.Pool(pool), s)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range parts {
			if p.DetachPending || p.To.Before(start) {
				return false
			}
		}
		return true
	})
	t.Logf("%d writes behind a 14s reader", writes.Load())
}

// Finding 5: after the conversion of a table with events, the operator
// role of `outbox migrate --print-grants` runs `outbox cleanup`: its inbox
// clean-up works, and the partition upkeep, which needs the tables' owner,
// is skipped (CleanupResult.PartitionUpkeepSkipped) instead of failing the
// command.
func TestPartitionOperatorCleanup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	writeEvents(t, pool, w, 3, 1)
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.processed_events (consumer_name, event_id, processed_at)
VALUES ('c', gen_random_uuid(), now() - interval '2 hours'), ('c', gen_random_uuid(), now())`); err != nil {
		t.Fatal(err)
	}
	roles := outboxmigrate.Roles{Writer: outboxtest.UniqueName(t, "w"), Relay: outboxtest.UniqueName(t, "r"),
		Operator: outboxtest.UniqueName(t, "o"), Consumer: outboxtest.UniqueName(t, "c")}
	op := roles.Operator
	for _, r := range []string{roles.Writer, roles.Relay, roles.Operator, roles.Consumer} {
		if _, err := pool.Exec(ctx, "CREATE ROLE "+r+" LOGIN"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // before the schema is dropped, after the role's pool closed
			_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+r)
			_, _ = pool.Exec(context.Background(), "DROP ROLE "+r)
		})
	}
	script, err := outboxmigrate.Grants(schema, roles)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, script); err != nil {
		t.Fatalf("apply grants: %v", err)
	}
	res, err := outboxmigrate.Partition(ctx, pool, schema, outboxmigrate.PartitionConfig{Interval: time.Hour, Ahead: 2})
	if err != nil || res.Kept == "" {
		t.Fatalf("conversion %+v, %v", res, err)
	}
	pcfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.User = op
	opPool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(opPool.Close)
	admin, err := outbox.NewAdmin(opPool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	cres, err := admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: time.Hour, InboxOlderThan: time.Hour})
	if err != nil {
		t.Fatalf("operator clean-up after conversion: %v", err)
	}
	if cres.InboxRows != 1 || !cres.PartitionUpkeepSkipped {
		t.Fatalf("operator clean-up %+v: want the one old inbox row deleted and the upkeep skipped", cres)
	}
	if _, err := admin.Status(ctx); err != nil {
		t.Fatalf("operator status after conversion: %v", err)
	}
	// The partitions made ahead let the operator read them, as status
	// does for one whose detach is unfinished.
	var readable bool
	if err := pool.QueryRow(ctx, `SELECT bool_and(has_table_privilege($1, c.oid, 'SELECT')) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $2::regclass`, op, schema+".outbox_events").Scan(&readable); err != nil || !readable {
		t.Fatalf("the operator reads every partition: %v, %v", readable, err)
	}
}
