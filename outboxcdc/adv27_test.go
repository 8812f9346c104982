package outboxcdc_test

// Adversarial tests of the CDC relay, second review (adv27): interleavings
// with operators and with the relay's own reconnections, the
// least-privileged role, and odd rows in the WAL. Each states the promise it
// tries to break.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxcdc"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestAdv27AlteredPublicationIsNoticedWhileStreaming: Setup refuses a
// publication that does not publish every insert whole, because "a stream
// reading only some inserts would look healthy while the rest waited for the
// safety net" (docs/operations.md, Objects). The check runs only at start. A
// publication altered while the relay streams (ALTER PUBLICATION ... SET
// (publish = 'update'), a row filter, DROP TABLE) takes effect in the WAL
// sender at once: the stream reads no insert any more, yet it stays
// streaming and ready, and with no safety net nothing publishes the events
// ever. The relay must notice and say so (Ready, or Run ending with the
// reason) as it does at start.
func TestAdv27AlteredPublicationIsNoticedWhileStreaming(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, alter string }{
		{"updates only", "SET (publish = 'update')"},
		{"table dropped from it", "DROP TABLE %s.outbox_events"},
		{"row filter", "SET TABLE %s.outbox_events WHERE (aggregate_type <> 'order')"},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, nil)
			ctx := context.Background()
			c, err := outboxcdc.New(outboxcdc.Config{
				DatabaseURL: e.url, Pool: e.pool, Schema: e.schema, Group: "g", Relay: e.relay(t, "cdc", 0, nil),
				BatchSize: 50, StatusInterval: 200 * time.Millisecond, RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond,
				StandbyInterval: 100 * time.Millisecond, Logger: quiet(),
			})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(runCtx) }()
			defer func() { cancel(); <-done }()
			outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
			e.write(t, "before", 1, 1)
			outboxtest.Eventually(t, 30*time.Second, "published before the alter", func() bool { return c.Stats().Published() == 1 })

			alter := tc.alter
			if strings.Contains(alter, "%s") {
				alter = fmt.Sprintf(alter, e.schema)
			}
			if _, err := e.pool.Exec(ctx, `ALTER PUBLICATION `+outboxcdc.PublicationName(e.schema)+` `+alter); err != nil {
				t.Fatal(err)
			}
			e.write(t, "after", 1, 1)
			deadline := time.Now().Add(30 * time.Second)
			for {
				select {
				case err := <-done:
					done <- err // for the deferred stop
					t.Logf("Run ended: %v", err)
					return
				default:
				}
				if err := c.Ready(); err != nil {
					t.Logf("not ready: %v", err)
					return
				}
				if c.Stats().Published() == 2 {
					return // the stream still reads the inserts: nothing to notice
				}
				if time.Now().After(deadline) {
					t.Fatalf("30 s after the publication was altered (%s) the stream reads no insert (received %d, published %d) and reports itself streaming and ready: every event waits for a safety net (none here), unseen",
						alter, c.Stats().Received(), c.Stats().Published())
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// TestAdv27RewindIsNotATakeover: Stats.Takeovers (the metric
// outbox_cdc_takeovers_total) counts "the times this relay started streaming
// after standing by", and standing by means "another process streams its
// slot". A relay alone on its slot whose queue fills (MaxQueued) rewinds:
// it closes its replication connection and streams again at once. Its own
// WAL sender has not always exited when it looks at the slot, so it used to
// find the slot active for its own previous WAL sender, log "standing by:
// another process streams the slot", wait a StandbyInterval and count a
// takeover from itself.
func TestAdv27RewindIsNotATakeover(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, nil), nil, func(c *outboxcdc.Config) {
		c.MaxQueued, c.BatchSize = 1, 1
		c.StandbyInterval = 300 * time.Millisecond
	})
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	e.burstUntilRewind(t, c.Stats())
	outboxtest.Eventually(t, 60*time.Second, "every event published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	if n := c.Stats().Takeovers(); n != 0 {
		t.Fatalf("%d takeovers counted (%d standby checks) by the only relay of the slot after %d rewinds of its own: it stood by for its own WAL sender",
			n, c.Stats().StandbyChecks(), c.Stats().Rewinds())
	}
}

// TestAdv27LeastPrivilegedRoleStreams: docs/operations.md (Server settings,
// Roles) says the CDC relay's role needs REPLICATION and the relay grants of
// `outbox migrate --print-grants`, and only the first start (Setup) needs
// the table's owner, for the publication. Here the owner creates the
// publication, and a login role with REPLICATION and the relay role's grants
// (nothing more) runs everything else: the slot's creation, the stream, the
// safety net, a standby of the same group beside it (its look at
// pg_replication_slots), the takeover when the streaming relay stops, and a
// slot PostgreSQL invalidated (here: dropped by hand), which the relay
// creates again.
func TestAdv27LeastPrivilegedRoleStreams(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	script, err := outboxmigrate.Grants(e.schema, outboxmigrate.Roles{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"outbox_writer", "outbox_relay", "outbox_operator", "outbox_consumer"} {
		if _, err := e.pool.Exec(ctx, "CREATE ROLE "+r+" NOLOGIN"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.pool.Exec(ctx, script); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, "CREATE ROLE cdc_login LOGIN REPLICATION IN ROLE outbox_relay"); err != nil {
		t.Fatal(err)
	}
	// The owner's part: the publication (Setup creates the slot too; the
	// relay's role must be able to do that itself, so it is dropped).
	if err := outboxcdc.Setup(ctx, outboxcdc.Config{Pool: e.pool, Schema: e.schema, Group: "g"}); err != nil {
		t.Fatal(err)
	}
	slot := outboxcdc.SlotName(e.schema, "g")
	if _, err := e.pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
		t.Fatal(err)
	}
	url := strings.Replace(e.url, "postgres://postgres@", "postgres://cdc_login@", 1)
	if url == e.url {
		t.Fatalf("cannot make a URL for another user from %s", e.url)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var super bool
	if err := pool.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil || super {
		t.Fatalf("the relay's connection is a superuser (%v) or failed (%v)", super, err)
	}
	lp := &env{cluster: e.cluster, url: url, pool: pool, schema: e.schema, w: e.w, js: e.js, stream: e.stream, pub: e.pub}
	a, stopA := lp.startCDC(t, "g", lp.relay(t, "a-cdc", 0, nil), lp.relay(t, "a", 2*time.Second, nil))
	outboxtest.Eventually(t, 30*time.Second, "a streams", a.Stats().Streaming)
	b, _ := lp.startCDC(t, "g", lp.relay(t, "b-cdc", 0, nil), lp.relay(t, "b", 2*time.Second, nil))
	outboxtest.Eventually(t, 30*time.Second, "b stands by", b.Stats().StandingBy)
	e.write(t, "one", 3, 2)
	outboxtest.Eventually(t, 30*time.Second, "published by a's stream", func() bool { return a.Stats().Published() == 6 })
	stopA()
	outboxtest.Eventually(t, 30*time.Second, "b takes over", b.Stats().Streaming)
	e.write(t, "two", 3, 2)
	outboxtest.Eventually(t, 30*time.Second, "published by b's stream", func() bool { return b.Stats().Published() == 6 })
	// The slot lost: terminated and dropped by hand; b creates it again.
	if _, err := e.pool.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", slot); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "slot dropped", func() bool {
		_, err := e.pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot)
		return err == nil
	})
	e.write(t, "gap", 3, 1)
	outboxtest.Eventually(t, 30*time.Second, "slot created again and streamed", func() bool { return b.Stats().Streaming() && e.confirmed(t, slot) > 0 })
	e.write(t, "three", 3, 1)
	outboxtest.Eventually(t, 60*time.Second, "every event published (the gap by the safety net)", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	if err := b.Ready(); err != nil {
		t.Fatalf("b not ready: %v", err)
	}
	checkInvariants(t, e.brokerMessages(t), 18)
}

// TestAdv27OddRowsInTheWAL: the stream decodes event_id, aggregate_type and
// aggregate_id from the WAL (the lane key joins the last two with a NUL).
// Aggregates whose ids are as odd as the writer allows (512 bytes, unicode,
// spaces, a type and id that would collide if joined without a separator,
// ids that differ only in case or in a trailing space), and events with a
// large payload and headers, all written in one transaction in an order that
// interleaves the aggregates, must reach the destination once each, in
// sequence order per aggregate, published by the stream.
func TestAdv27OddRowsInTheWAL(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, nil), nil)
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	type agg struct{ typ, id string }
	aggs := []agg{
		{"order", strings.Repeat("é", 256)}, // 512 bytes
		{"order", "ünïcødé 🚀 id"},           // 4-byte runes, spaces
		{"ord", "erx"}, {"order", "x"},      // "order"+"x" == "ord"+"erx" joined without a separator
		{"order", "Case"}, {"order", "case"}, {"order", "case "},
		{"order", `a"b\c'd`},
		{strings.Repeat("t", 255), "long-type"},
	}
	big := `{"blob":"` + strings.Repeat("z", 900_000) + `"}`
	// One call per round: a further InsertTx call must not write to an
	// aggregate that sorts before one it wrote to (a deadlock guard).
	const rounds = 3
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		for r := 0; r < rounds; r++ {
			evs := make([]outbox.Event, 0, len(aggs))
			for i, a := range aggs {
				ev := outbox.Event{AggregateType: a.typ, AggregateID: a.id, Type: fmt.Sprintf("E%d", r), Payload: []byte(`{}`),
					Headers: map[string]string{"x-note": "line one: ünïcødé"}}
				if i == 0 {
					ev.Payload = []byte(big)
				}
				evs = append(evs, ev)
			}
			if _, err := e.w.InsertTx(ctx, tx, evs...); err != nil {
				return fmt.Errorf("round %d: %w", r, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := rounds * len(aggs)
	outboxtest.Eventually(t, 60*time.Second, "every event published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	if c.Stats().Published() != int64(want) || c.Stats().Left() != 0 {
		t.Fatalf("the stream published %d of %d and left %d", c.Stats().Published(), want, c.Stats().Left())
	}
	checkInvariants(t, e.brokerMessages(t), want)
}

// flakyPublisher fails the first attempt of about a third of the events:
// some refused outright, some acknowledged by the broker and then reported
// failed (an ambiguous timeout), some failed as the destination being
// unavailable while the rest of the batch goes through.
type flakyPublisher struct {
	outbox.Publisher
	mu   sync.Mutex
	seen map[uuid.UUID]bool
}

func (f *flakyPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	var pass []outbox.Message
	var at []int
	f.mu.Lock()
	for i, m := range msgs {
		first := !f.seen[m.ID]
		f.seen[m.ID] = true
		switch {
		case first && m.ID[0]%6 == 0:
			errs[i] = errors.New("refused once")
		case first && m.ID[0]%6 == 1:
			errs[i] = outbox.Unavailable(errors.New("partition leader moving"))
		case first && m.ID[0]%6 == 2:
			// acknowledged below, then reported failed
			pass, at = append(pass, m), append(at, -i-1)
		default:
			pass, at = append(pass, m), append(at, i)
		}
	}
	f.mu.Unlock()
	if len(pass) > 0 {
		res := f.Publisher.Publish(ctx, pass)
		for j, k := range at {
			var err error
			if res != nil {
				err = res[j]
			}
			if k < 0 {
				errs[-k-1] = errors.New("timed out waiting for the ack")
				continue
			}
			errs[k] = err
		}
	}
	return errs
}

// TestAdv27FlakyDestination: a destination that refuses some events once,
// reports some unavailable while it takes the rest of the batch, and
// acknowledges some and then reports them failed, under many aggregates
// written in interleaved transactions. The stream alone (no safety net)
// must publish every event (I3), first deliveries in sequence order per
// aggregate (I5), leave nothing to the table, and confirm the slot past the
// last commit only once everything is published.
func TestAdv27FlakyDestination(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	flaky := &flakyPublisher{Publisher: e.pub, seen: map[uuid.UUID]bool{}}
	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, flaky), nil)
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	slot := outboxcdc.SlotName(e.schema, "g")
	last := e.write(t, "w", 8, 25)
	for {
		got := e.confirmed(t, slot)
		if e.count(t, "published_at IS NULL") == 0 {
			break
		}
		if got > last {
			t.Fatalf("slot confirmed at %s past the last commit with %d events unpublished", got, e.count(t, "published_at IS NULL"))
		}
		if c.Stats().Left() > 0 {
			t.Fatalf("the stream left %d events to the table (published %d)", c.Stats().Left(), c.Stats().Published())
		}
		time.Sleep(50 * time.Millisecond)
	}
	seen := checkInvariants(t, e.brokerMessages(t), 200)
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	t.Logf("published %d, already published %d, outages %d, duplicates at the broker %d", c.Stats().Published(), c.Stats().AlreadyPublished(), c.Stats().Outages(), dups)
}

// TestAdv27SavepointsAndABigTransaction: a transaction that writes two
// aggregates, rolls one write back to a savepoint and writes again (the
// sequence is taken again), and a transaction with ten times MaxQueued
// events arriving while the queue holds others. Only committed events reach
// the destination, once each, in order, all by the stream.
func TestAdv27SavepointsAndABigTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	hold := holding(e.pub)
	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, hold), nil, func(c *outboxcdc.Config) { c.MaxQueued, c.BatchSize = 20, 10 })
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	var rolledBack uuid.UUID
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := e.w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "a", Type: "One", Payload: []byte(`{}`)},
			outbox.Event{AggregateType: "order", AggregateID: "b", Type: "One", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		ids, err := e.w.InsertTx(ctx, sp, outbox.Event{AggregateType: "order", AggregateID: "b", Type: "RolledBack", Payload: []byte(`{}`)})
		if err != nil {
			return err
		}
		rolledBack = ids[0].ID
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		_, err = e.w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "b", Type: "Two", Payload: []byte(`{}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	hold.arm()
	e.write(t, "small", 5, 1)
	outboxtest.Eventually(t, 30*time.Second, "a publish is held", hold.held.Load)
	e.write(t, "queued", 5, 2)
	e.write(t, "big", 200, 1) // 200 events, MaxQueued 20
	last := e.write(t, "after", 5, 2)
	outboxtest.Eventually(t, 30*time.Second, "the stream read everything", func() bool { return c.Stats().Received() >= 3+5+10+200+10 })
	hold.unhold()
	outboxtest.Eventually(t, 60*time.Second, "every event published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	outboxtest.Eventually(t, 30*time.Second, "slot confirmed past the last commit", func() bool { return e.confirmed(t, outboxcdc.SlotName(e.schema, "g")) > last })
	seen := checkInvariants(t, e.brokerMessages(t), 3+5+10+200+10)
	if seen[rolledBack] > 0 {
		t.Fatal("an event rolled back to its savepoint reached the broker")
	}
	if c.Stats().Left() != 0 || c.Stats().Published() != 228 {
		t.Fatalf("the stream published %d and left %d, want 228 and 0 (deferred %d, rewinds %d)", c.Stats().Published(), c.Stats().Left(), c.Stats().Deferred(), c.Stats().Rewinds())
	}
}

// TestAdv27LeastPrivilegedRoleAfterAPublicationDropped: docs/operations.md
// (Recovery) says a publication dropped by hand is created again by the
// relay. The least-privileged role cannot create it (only the table's owner
// can). The relay must not stop (with it the safety net) nor claim to be
// ready: it keeps its safety net publishing, reports why the stream is not
// running, and streams again once the owner has created the publication.
func TestAdv27LeastPrivilegedRoleAfterAPublicationDropped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	script, err := outboxmigrate.Grants(e.schema, outboxmigrate.Roles{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"outbox_writer", "outbox_relay", "outbox_operator", "outbox_consumer"} {
		if _, err := e.pool.Exec(ctx, "CREATE ROLE "+r+" NOLOGIN"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.pool.Exec(ctx, script); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, "CREATE ROLE cdc_login LOGIN REPLICATION IN ROLE outbox_relay"); err != nil {
		t.Fatal(err)
	}
	if err := outboxcdc.Setup(ctx, outboxcdc.Config{Pool: e.pool, Schema: e.schema, Group: "g"}); err != nil {
		t.Fatal(err)
	}
	url := strings.Replace(e.url, "postgres://postgres@", "postgres://cdc_login@", 1)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	lp := &env{cluster: e.cluster, url: url, pool: pool, schema: e.schema, w: e.w, js: e.js, stream: e.stream, pub: e.pub}
	c, err := outboxcdc.New(outboxcdc.Config{
		DatabaseURL: url, Pool: pool, Schema: e.schema, Group: "g", Relay: lp.relay(t, "cdc", 0, nil), SafetyNet: lp.relay(t, "net", 2*time.Second, nil),
		BatchSize: 50, StatusInterval: 200 * time.Millisecond, RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		StandbyInterval: 100 * time.Millisecond, Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	e.write(t, "before", 2, 1)
	outboxtest.Eventually(t, 30*time.Second, "published by the stream", func() bool { return c.Stats().Published() == 2 })
	if _, err := e.pool.Exec(ctx, `DROP PUBLICATION `+outboxcdc.PublicationName(e.schema)); err != nil {
		t.Fatal(err)
	}
	e.write(t, "gap", 2, 1)
	outboxtest.Eventually(t, 30*time.Second, "the relay reports the stream down", func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("Run returned (%v): the safety net stopped with the stream", err)
		default:
		}
		return c.Ready() != nil
	})
	t.Logf("not ready: %v", c.Ready())
	outboxtest.Eventually(t, 60*time.Second, "the gap published by the safety net", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	// The owner creates the publication again; the relay streams again.
	if err := outboxcdc.Setup(ctx, outboxcdc.Config{Pool: e.pool, Schema: e.schema, Group: "g"}); err != nil {
		t.Fatal(err)
	}
	before := c.Stats().Published()
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; c.Stats().Published() == before; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("the stream published nothing in the 60 s after the owner created the publication again (ready: %v)", c.Ready())
		}
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := e.w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("after-%d", i), Type: "Placed", Payload: []byte(`{}`)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestAdv27SlotNamesOfTwoSchemasDoNotCollide: SlotName joins schema and
// group with "_", which both may contain: schema "shop" with group "eu_1"
// and schema "shop_eu" with group "1" get the same slot. The relays of the
// two schemas then share one slot: while one streams, the other stands by
// for ever (its events wait for its safety net), and whichever streams
// confirms the slot past the other's unfinished transactions. Slots (outbox
// status, the slot metrics and alerts) of schema "shop" also lists the slots
// of schema "shop_eu".
func TestAdv27SlotNamesOfTwoSchemasDoNotCollide(t *testing.T) {
	t.Parallel()
	if a, b := outboxcdc.SlotName("shop", "eu_1"), outboxcdc.SlotName("shop_eu", "1"); a == b {
		t.Errorf("schema shop, group eu_1 and schema shop_eu, group 1 share the slot %s", a)
	}
	if a, b := outboxcdc.SlotName("shop", "eu_default"), outboxcdc.SlotName("shop_eu", outboxcdc.GroupDefault); a == b {
		t.Errorf("schema shop, group eu_default and schema shop_eu's default group share the slot %s", a)
	}
}

// refuseTypes refuses, for good, every event of the given types.
type refuseTypes struct {
	outbox.Publisher
	types map[string]bool
}

func (r refuseTypes) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	var pass []outbox.Message
	var at []int
	for i, m := range msgs {
		if r.types[m.Type] {
			errs[i] = outbox.Permanent(errors.New("schema rejected"))
			continue
		}
		pass, at = append(pass, m), append(at, i)
	}
	if len(pass) > 0 {
		res := r.Publisher.Publish(ctx, pass)
		for j, i := range at {
			if res != nil {
				errs[i] = res[j]
			}
		}
	}
	return errs
}

// TestAdv27SkipWhileTheSuccessorWaits: docs/design.md (The waiting set)
// promised that "a lane's next events go out as soon as its head is
// published, whoever published the head: the stream itself, a polling
// relay, the safety net, an operator's skip". The stream quarantines a head
// the destination refuses for good; its successors (one in the same
// transaction, one written after the quarantine) are parked, and the stream
// leaves them to the table at once: after the operator's skip, with no
// safety net, nothing published them. The design now says what happens:
// the safety net publishes them, within a quarter of its threshold once
// they are that old, in order, the first with SkippedFrom.
func TestAdv27SkipWhileTheSuccessorWaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	pub := refuseTypes{Publisher: e.pub, types: map[string]bool{"Poison": true}}
	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, pub), e.relay(t, "net", 2*time.Second, pub))
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	var poison uuid.UUID
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		ids, err := e.w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "p", Type: "Poison", Payload: []byte(`{}`)},
			outbox.Event{AggregateType: "order", AggregateID: "p", Type: "Second", Payload: []byte(`{}`)})
		if err == nil {
			poison = ids[0].ID
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "the head quarantined", func() bool { return e.count(t, "quarantined_at IS NOT NULL") == 1 })
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := e.w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "p", Type: "Third", Payload: []byte(`{}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "the stream read the third", func() bool { return c.Stats().Received() == 3 })
	admin, err := outbox.NewAdmin(e.pool, outbox.AdminConfig{Schema: e.schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Skip(ctx, poison, "adv27", "refused by the destination's schema"); err != nil {
		t.Fatal(err)
	}
	skipped := time.Now()
	deadline := skipped.Add(30 * time.Second)
	for e.count(t, "published_at IS NULL") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the skip, %d successors are unpublished (stream: published %d, waiting %d, left %d; the safety net's threshold is 2 s)",
				e.count(t, "published_at IS NULL"), c.Stats().Published(), c.Stats().Waiting(), c.Stats().Left())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("successors published %s after the skip; stream left %d", time.Since(skipped).Round(time.Millisecond), c.Stats().Left())
	msgs := e.brokerMessages(t)
	if len(msgs) != 2 || msgs[0].Type != "Second" || msgs[1].Type != "Third" || msgs[0].SkippedFrom != 1 {
		t.Fatalf("broker got %d messages; want Second (skipped from 1) then Third: %+v", len(msgs), msgs)
	}
}

// TestAdv27TwoGroupsOnOneSchema: two relay groups on one schema each
// stream their own slot and race for every event (docs/operations.md:
// plain polling relays are safe beside CDC, and a CDC group is a relay like
// any other). Neither may publish out of order, and neither may leave an
// event the other published or confirm its slot past an event still
// unpublished; with no safety net, the two streams publish everything.
func TestAdv27TwoGroupsOnOneSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	a, _ := e.startCDC(t, "g1", e.relay(t, "cdc-1", 0, nil), nil, func(c *outboxcdc.Config) { c.BatchSize = 7 })
	b, _ := e.startCDC(t, "g2", e.relay(t, "cdc-2", 0, nil), nil, func(c *outboxcdc.Config) { c.BatchSize = 5 })
	outboxtest.Eventually(t, 30*time.Second, "both stream", func() bool { return a.Stats().Streaming() && b.Stats().Streaming() })
	last := e.write(t, "w", 6, 40)
	s1, s2 := outboxcdc.SlotName(e.schema, "g1"), outboxcdc.SlotName(e.schema, "g2")
	deadline := time.Now().Add(60 * time.Second)
	for {
		c1, c2 := e.confirmed(t, s1), e.confirmed(t, s2)
		n := e.count(t, "published_at IS NULL")
		if n == 0 && c1 > last && c2 > last {
			break
		}
		if n > 0 && (c1 > last || c2 > last) {
			t.Fatalf("a slot confirmed past the last commit (%s, %s > %s) with %d events unpublished", c1, c2, last, n)
		}
		if time.Now().After(deadline) {
			t.Fatalf("60 s: %d unpublished; slots at %s and %s (last commit %s); left %d and %d", n, c1, c2, last, a.Stats().Left(), b.Stats().Left())
		}
		time.Sleep(50 * time.Millisecond)
	}
	checkInvariants(t, e.brokerMessages(t), 240)
	if a.Stats().Left()+b.Stats().Left() != 0 {
		t.Fatalf("left %d and %d to a safety net", a.Stats().Left(), b.Stats().Left())
	}
	t.Logf("published %d + %d; found published %d + %d", a.Stats().Published(), b.Stats().Published(), a.Stats().AlreadyPublished(), b.Stats().AlreadyPublished())
}

// hangingPublisher holds every Publish call until its context ends.
type hangingPublisher struct{ entered chan struct{} }

func (h hangingPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	select {
	case h.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	errs := make([]error, len(msgs))
	for i := range errs {
		errs[i] = ctx.Err()
	}
	return errs
}

// TestAdv27HungDestinationAtShutdown: a destination that never answers
// (a Publish that returns only when its context ends). The relay is
// stopped: Run must return within the relay's ShutdownTimeout (plus the
// marks' wait), release the events it held without spending an attempt,
// and not confirm the slot past them; a relay started next on the group
// publishes them all, in order, from the stream.
func TestAdv27HungDestinationAtShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	hang := hangingPublisher{entered: make(chan struct{}, 1)}
	r, err := outbox.NewRelay(e.pool, outbox.RelayConfig{
		Schema: e.schema, Publisher: hang, ID: "cdc", LeaseDuration: time.Minute, ShutdownTimeout: 300 * time.Millisecond, Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	c, stop := e.startCDC(t, "g", r, nil)
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	last := e.write(t, "w", 3, 4)
	select {
	case <-hang.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no publish began")
	}
	start := time.Now()
	stop()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Run took %s to return with a hung destination (ShutdownTimeout 300 ms)", d)
	}
	if got := e.confirmed(t, outboxcdc.SlotName(e.schema, "g")); got > last {
		t.Fatalf("slot confirmed at %s past the events the hung destination never took", got)
	}
	if n := e.count(t, "published_at IS NULL AND (claim_until > now() OR attempt_count > 0)"); n != 0 {
		t.Fatalf("%d events left leased or with an attempt spent after a shutdown cut their publish", n)
	}
	c2, _ := e.startCDC(t, "g", e.relay(t, "cdc2", 0, nil), nil)
	outboxtest.Eventually(t, 30*time.Second, "every event published by the next relay", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	checkInvariants(t, e.brokerMessages(t), 12)
	if c2.Stats().Left() != 0 {
		t.Fatalf("the next relay left %d", c2.Stats().Left())
	}
}

// TestAdv27RewindAfterATakeoverIsNotATakeover: a relay that took the slot
// over from another process counts one takeover. Its later rewinds (a full
// queue) start its own stream again; they are not takeovers. It used to keep
// its "was standing by" state through every rewind, and counted (and logged)
// a takeover at each.
func TestAdv27RewindAfterATakeoverIsNotATakeover(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	small := func(c *outboxcdc.Config) { c.MaxQueued, c.BatchSize = 1, 1 }
	a, stopA := e.startCDC(t, "g", e.relay(t, "cdc-a", 0, nil), nil, small)
	outboxtest.Eventually(t, 30*time.Second, "a streams", a.Stats().Streaming)
	b, _ := e.startCDC(t, "g", e.relay(t, "cdc-b", 0, nil), nil, small)
	outboxtest.Eventually(t, 30*time.Second, "b stands by", b.Stats().StandingBy)
	stopA()
	outboxtest.Eventually(t, 30*time.Second, "b takes over", b.Stats().Streaming)
	if n := b.Stats().Takeovers(); n != 1 {
		t.Fatalf("b counted %d takeovers, want 1", n)
	}
	e.burstUntilRewind(t, b.Stats())
	outboxtest.Eventually(t, 60*time.Second, "every event published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	if n := b.Stats().Takeovers(); n != 1 {
		t.Fatalf("b counted %d takeovers after %d rewinds of its own; it took the slot over once", n, b.Stats().Rewinds())
	}
}

// TestSlotOfAnEarlierVersionIsKept: an ambiguous schema or group name
// (here the test's schema, "cdc_<pid>") gets a hash in its slot name now.
// A group whose slot exists under the name an earlier version gave it, and
// not under the new one, keeps streaming that slot: it holds the group's
// position and its WAL, and a new slot beside it would leave it retaining
// WAL for ever. No slot of the new name is created.
func TestSlotOfAnEarlierVersionIsKept(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	legacy := "outbox_" + e.schema + "_g"
	if now := outboxcdc.SlotName(e.schema, "g"); now == legacy {
		t.Fatalf("the slot name of schema %s is still %s", e.schema, now)
	}
	if err := outboxcdc.Setup(ctx, outboxcdc.Config{Pool: e.pool, Schema: e.schema, Slot: legacy}); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := e.w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "kept", Type: "Placed", Payload: []byte(`{}`)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, nil), nil)
	outboxtest.Eventually(t, 60*time.Second, "the event published by the stream", func() bool {
		return e.count(t, "published_at IS NULL") == 0 && c.Stats().Published() > 0
	})
	var active bool
	if err := e.pool.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, legacy).Scan(&active); err != nil || !active {
		t.Fatalf("the earlier version's slot %s: active %v, %v", legacy, active, err)
	}
	var others int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name <> $1`, legacy).Scan(&others); err != nil || others != 0 {
		t.Fatalf("%d other slots (%v): a slot of the new name was created beside the earlier one", others, err)
	}
}

// burstUntilRewind writes bursts of 30 one-event transactions until the
// stream whose stats are st has rewound at least once: with MaxQueued 1,
// a burst committed faster than the stream publishes fills its queue, and
// the transactions it cannot queue are read again (a rewind).
func (e *env) burstUntilRewind(t *testing.T, st *outboxcdc.Stats) {
	t.Helper()
	ctx := context.Background()
	round := 0
	outboxtest.Eventually(t, 2*time.Minute, "a rewind of the stream", func() bool {
		if st.Rewinds() > 0 {
			return true
		}
		for i := 0; i < 30; i++ {
			err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				_, err := e.w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("r%d-a%d", round, i), Type: "Placed", Payload: []byte(`{}`)})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		round++
		return st.Rewinds() > 0
	})
}
