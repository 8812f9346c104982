package outbox_test

// Hostile review of the partitioned outbox, helper adv21 (issue 21, part
// 1). Each test here failed on main before its fix.

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/partman"
	"github.com/pgoutbox/outbox/internal/pgtx"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// rolePool opens a pool logged in as role.
func rolePool(t *testing.T, role string) *pgxpool.Pool {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.User = role
	p, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// createRole creates a LOGIN role dropped (with its rights) when the test
// ends, before the schema is.
func createRole(t *testing.T, pool *pgxpool.Pool, role string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "CREATE ROLE "+role+" LOGIN NOSUPERUSER"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = pool.Exec(context.Background(), "DROP ROLE "+role)
	})
}

// Finding A: cleanup_events (migration 011), the only way the relay and
// operator roles delete events, finds its rows by ctid. A ctid is unique
// within one table only: on a partitioned outbox_events the DELETE's
// "ctid = ANY (...)" matches the rows at those positions in every
// partition, unpublished ones included. The operator role, which "cannot
// delete an unpublished event", deletes one by calling the function it is
// granted; so does a relay of an earlier version (a rolling upgrade) and
// a relay whose clean-up run read outbox_events as a plain table just
// before the conversion (cleaner.run asks once per run).
func TestPartitionAdv21CleanupEventsSparesOtherPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	w := newWriter(t, schema)
	roles := outboxmigrate.Roles{Writer: outboxtest.UniqueName(t, "w"), Relay: outboxtest.UniqueName(t, "r"),
		Operator: outboxtest.UniqueName(t, "o"), Consumer: outboxtest.UniqueName(t, "c")}
	for _, r := range []string{roles.Writer, roles.Relay, roles.Operator, roles.Consumer} {
		createRole(t, pool, r)
	}
	op := roles.Operator
	script, err := outboxmigrate.Grants(schema, roles)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, script); err != nil {
		t.Fatalf("apply grants: %v", err)
	}
	// A settled event, long published, first row of the closed partition;
	// a pending one, first row of the current partition.
	settled := closedID(t, pool, schema, 1)
	if err := insertWithID(t, pool, w, "settled", settled); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now() - interval '1 minute' WHERE event_id = $1`, settled); err != nil {
		t.Fatal(err)
	}
	if err := insertWithID(t, pool, w, "pending", uuid.Nil); err != nil {
		t.Fatal(err)
	}
	// The settled event's update moved it to the second slot of its page;
	// one update (a claim's, say) moves the pending one there too.
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET attempt_count = attempt_count WHERE aggregate_id = 'pending'`); err != nil {
		t.Fatal(err)
	}
	var pending uuid.UUID
	var ctidSettled, ctidPending string
	if err := pool.QueryRow(ctx, `SELECT (SELECT ctid::text FROM `+schema+`.outbox_events WHERE event_id = $1),
	event_id, ctid::text FROM `+schema+`.outbox_events WHERE aggregate_id = 'pending'`, settled).Scan(&ctidSettled, &pending, &ctidPending); err != nil {
		t.Fatal(err)
	}
	if ctidSettled != ctidPending {
		t.Fatalf("setup: ctids %s and %s differ; the test needs two partitions' first rows", ctidSettled, ctidPending)
	}
	var deleted int64
	if err := rolePool(t, op).QueryRow(ctx, `SELECT `+schema+`.cleanup_events(interval '1 second', 1000)`).Scan(&deleted); err != nil {
		t.Fatalf("operator's cleanup_events: %v", err)
	}
	if found, published := visible(t, pool, schema, pending); !found || published {
		t.Fatalf("cleanup_events deleted %d row(s) on a partitioned outbox_events; the pending event %s (ctid %s, as the settled one's) found %v, published %v: want it kept, unpublished",
			deleted, pending, ctidPending, found, published)
	}
}

// Finding B: the upkeep's leftovers are the tables of the schema named as
// partitions that carry the marker comment; any role with CREATE on the
// schema can make one (a tenant sharing the schema, an application role
// given CREATE). An upkeep running as a superuser (the owner in many
// installs, the demo's) attaches the planted table when it holds an
// unpublished event: the relay then publishes an event no writer wrote,
// from a partition the tenant owns and can change at will. Its settle also
// UPDATEs the table, firing the tenant's triggers with the upkeep's
// rights. (An upkeep as a non-superuser owner cannot attach it and fails
// every round at this step, before any drop.)
func TestPartitionAdv21PlantedMarkerTableNotAttached(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	w := newWriter(t, schema)
	tenant := outboxtest.UniqueName(t, "tenant")
	createRole(t, pool, tenant)
	if _, err := pool.Exec(ctx, `GRANT USAGE, CREATE ON SCHEMA `+schema+` TO `+tenant); err != nil {
		t.Fatal(err)
	}
	// The tenant's table: outbox_events' shape (the tenant writes the DDL
	// from the migrations), an event of its own in a range of 2001, and
	// the marker with that range.
	from := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	planted := partman.Name(from)
	id := partman.Bound(from)
	id[6], id[8], id[15] = 0x70, 0x80, 1
	if err := insertWithID(t, pool, w, "invented", uuid.Nil); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, q := range []string{
			`CREATE TABLE ` + schema + `.` + planted + ` (LIKE ` + schema + `.outbox_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`,
			`ALTER TABLE ` + schema + `.` + planted + ` OWNER TO ` + tenant,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		// Move the writer's row into the tenant's table with the 2001 id
		// (as the tenant would INSERT it).
		if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.`+planted+` SELECT * FROM `+schema+`.outbox_events WHERE aggregate_id = 'invented'`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+schema+`.outbox_events WHERE aggregate_id = 'invented'`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE `+schema+`.`+planted+` SET event_id = $1`, id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+tenant); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `COMMENT ON TABLE `+schema+`.`+planted+` IS 'outbox upkeep: detaching from outbox_events FOR VALUES FROM (''`+
			partman.Bound(from).String()+`'') TO (''`+partman.Bound(from.Add(10*time.Second)).String()+`'')'`)
		return err
	})
	if err != nil {
		t.Fatalf("plant: %v", err)
	}
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	res, err := admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: time.Millisecond})
	if err != nil {
		t.Fatalf("clean-up with a planted table in the schema: %v", err)
	}
	if found, _ := visible(t, pool, schema, id); found {
		t.Fatalf("clean-up %+v: the tenant's event %s is in outbox_events (its table attached as a partition): want the table left alone", res, id)
	}
	if exists, attached := isPartition(t, pool, schema, planted); !exists || attached {
		t.Fatalf("the tenant's table exists %v, attached %v: want it left as it was", exists, attached)
	}
}

// Finding E: the upkeep names the next partition after its start; a role
// with CREATE on the schema that made a table of that name first (a
// tenant, by mistake or not) failed every round's creation ahead ("relation
// already exists"), and once the partitions ahead ran out, every write was
// refused with ErrNoPartition. The upkeep now names the partition
// otherwise and goes on.
func TestPartitionAdv21SquattedNameDoesNotStopCreation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	s := mustSchema(t, schema)
	tenant := outboxtest.UniqueName(t, "tenant")
	createRole(t, pool, tenant)
	if _, err := pool.Exec(ctx, `GRANT USAGE, CREATE ON SCHEMA `+schema+` TO `+tenant); err != nil {
		t.Fatal(err)
	}
	parts, err := partman.List(ctx, pgtx.Pool(pool), s)
	if err != nil || len(parts) == 0 {
		t.Fatalf("partitions %v, %v", parts, err)
	}
	next := parts[len(parts)-1].To
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+tenant); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE `+schema+`.`+partman.Name(next)+` (note text)`)
		return err
	})
	if err != nil {
		t.Fatalf("squat: %v", err)
	}
	// The round run when the newest partition's interval starts: the next
	// partition it makes starts at next.
	later := next.Add(-10 * time.Second)
	made, err := partman.EnsureAhead(ctx, pgtx.Pool(pool), s, later, 2)
	if err != nil {
		t.Fatalf("creation ahead with %s squatted: %v", partman.Name(next), err)
	}
	id := partman.Bound(next)
	id[6], id[8], id[15] = 0x70, 0x80, 1
	if err := insertWithID(t, pool, newWriter(t, schema), "later", id); err != nil {
		t.Fatalf("made %v; an event of the squatted range: %v, want it written", made, err)
	}
}

// laneRecorder records the sequences of one aggregate in the order they
// were published.
type laneRecorder struct {
	agg  string
	mu   sync.Mutex
	seqs []int64
}

func (r *laneRecorder) Publish(_ context.Context, msgs []outbox.Message) []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		if m.AggregateID == r.agg {
			r.seqs = append(r.seqs, m.Sequence)
		}
	}
	return make([]error, len(msgs))
}

func (r *laneRecorder) published() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seqs)
}

// Finding F (I5): an event k written into a partition between the upkeep's
// check and its DETACH (an id from the past: a long transaction's, whose
// id was minted when it began; a writer whose clock is behind) is out of
// outbox_events while the partition is detach pending or left detached.
// The claim's head test reads a missing predecessor as one cleaned up
// after publication, so the aggregate's next event k+1, written afterwards
// with a current id, is published before k; k follows once a round by the
// owner attaches its table again (the least-privileged relay role never
// does: `outbox cleanup` as the owner, from cron, minutes later).
func TestPartitionAdv21LateEventKeepsLaneOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	s := mustSchema(t, schema)
	w := newWriter(t, schema)
	roles := outboxmigrate.Roles{Writer: outboxtest.UniqueName(t, "w"), Relay: outboxtest.UniqueName(t, "r"),
		Operator: outboxtest.UniqueName(t, "o"), Consumer: outboxtest.UniqueName(t, "c")}
	for _, r := range []string{roles.Writer, roles.Relay, roles.Operator, roles.Consumer} {
		createRole(t, pool, r)
	}
	script, err := outboxmigrate.Grants(schema, roles)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, script); err != nil {
		t.Fatalf("apply grants: %v", err)
	}
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	settled, late := closedID(t, pool, schema, 1), closedID(t, pool, schema, 2)
	part := partman.Name(partman.TimeOf(settled))
	if err := insertWithID(t, pool, w, "settled", settled); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now() - interval '1 second' WHERE event_id = $1`, settled); err != nil {
		t.Fatal(err)
	}
	var lateErr error
	remove := partman.SetHook(s, func(step, p string) error {
		switch {
		case p != part:
		case step == "before-detach": // after the check through the parent
			lateErr = insertWithID(t, pool, w, "lane", late)
		case step == "after-detach":
			return errors.New("injected: the connection died after the detach")
		}
		return nil
	})
	_, err = admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: time.Millisecond})
	remove()
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("clean-up: %v, want the injected error", err)
	}
	if lateErr != nil && !errors.Is(lateErr, outbox.ErrNoPartition) {
		t.Fatalf("the late write into the partition being dropped: %v, want it written or refused with ErrNoPartition", lateErr)
	}
	// The aggregate's next event, with an id the writer makes.
	if err := insertWithID(t, pool, w, "lane", uuid.Nil); err != nil {
		t.Fatal(err)
	}
	var last int64
	if err := pool.QueryRow(ctx, `SELECT max(aggregate_sequence) FROM `+schema+`.outbox_events WHERE aggregate_id = 'lane'`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	rec := &laneRecorder{agg: "lane"}
	startRelay(t, rolePool(t, roles.Relay), quietConfig(schema, rec))
	outboxtest.Eventually(t, 20*time.Second, "the relay publishes the lane's last visible event", func() bool {
		return slices.Contains(rec.published(), last)
	})
	if got := rec.published(); got[0] != 1 {
		t.Fatalf("lane published %v (the late write: %v): sequence %d went out while 1 was in the detached %s, want 1 first",
			got, lateErr, got[0], part)
	}
}
