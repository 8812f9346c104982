package outboxcdc_test

// Adversarial tests of the CDC stream (review "adv-cdc"): each one states a
// promise of docs/design.md, "Change-data capture", or docs/operations.md,
// "Operating CDC", and tries to break it. None of them runs a safety net
// unless it says so: what the stream promises to publish itself, it must.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxcdc"
)

// brokenOncePublisher passes messages to a Publisher, except that its first
// call returns one result too many without publishing anything: a broken
// Publisher, which PublishIDs reports as an error and treats "as with a
// crash" (the batch keeps its lease, which expires).
type brokenOncePublisher struct {
	outbox.Publisher
	calls atomic.Int64
}

func (b *brokenOncePublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	if b.calls.Add(1) == 1 {
		return make([]error, len(msgs)+1)
	}
	return b.Publisher.Publish(ctx, msgs)
}

// TestAdvCDCKeepsAnEventItClaimedAndNeverPublished: a PublishIDs call
// claims an event and fails before anything reaches the destination (a
// broken Publisher here; a SIGKILL after the claim followed by a restart
// with the same relay ID leaves the same rows behind). The event is
// unpublished and unacknowledged, leased by the stream's own relay. The
// design promises that the slot is never confirmed past a transaction whose
// ids were not finished, and that a relay "restarts from a position at or
// before the first transaction it had not finished": the stream must keep
// the event and publish it once its lease ends.
//
// It does not: stateSQL counts any live lease of the stream's own relay as
// "acknowledged, its mark being written in the background", so the retry
// finishes the event as done, the slot is confirmed past it, and only a
// safety net (none here) would ever publish it.
func TestAdvCDCKeepsAnEventItClaimedAndNeverPublished(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	pub := &brokenOncePublisher{Publisher: e.pub}
	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, pub), nil)
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	last := e.write(t, "x", 1, 1)
	outboxtest.Eventually(t, 30*time.Second, "the broken publish happened", func() bool { return pub.calls.Load() >= 1 })
	slot := outboxcdc.SlotName(e.schema, "g")
	// The lease is 1 s and the stream waits up to WaitLimit (a minute) for
	// an event it could not publish yet: it has all the time it needs.
	// The slot's position is read before the table: a confirmation past
	// the event is a violation only if the event is still unpublished
	// after it (the stream confirms once the marks are written, so reading
	// the table first could see the event unpublished just before the
	// stream published, marked and confirmed it).
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := e.confirmed(t, slot)
		if e.count(t, "published_at IS NULL") == 0 {
			break
		}
		if got > last {
			t.Fatalf("slot confirmed at %s, past the commit of an event that was never acknowledged and is unpublished (stream: published %d, already published %d, left %d, waiting %d)",
				got, c.Stats().Published(), c.Stats().AlreadyPublished(), c.Stats().Left(), c.Stats().Waiting())
		}
		if time.Now().After(deadline) {
			t.Fatalf("the event the stream claimed and never published is still unpublished 30 s later (lease 1 s, no safety net): published %d, already published %d, left %d",
				c.Stats().Published(), c.Stats().AlreadyPublished(), c.Stats().Left())
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkInvariants(t, e.brokerMessages(t), 1)
}

// TestAdvCDCSetupRefusesAPublicationThatDropsInserts: Setup accepts an
// existing publication of the configured name when it "covers" the outbox
// table, without looking at what it publishes. A publication made or
// altered by hand that does not publish inserts, or publishes only some
// rows (a PostgreSQL 15 row filter), makes the stream read nothing (or not
// everything) while it reports itself streaming and ready: every event then
// waits for the safety net's --reconcile-after, and without one forever.
// Setup must refuse such a publication as it refuses one that does not
// cover the table.
func TestAdvCDCSetupRefusesAPublicationThatDropsInserts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	cases := []struct{ name, with string }{
		{"updates only", " WITH (publish = 'update')"},
		{"row filter", " WHERE (aggregate_type <> 'invoice') WITH (publish = 'insert')"},
	}
	for i, tc := range cases {
		group := fmt.Sprintf("g%d", i)
		pubName := fmt.Sprintf("adv_pub_%d", i)
		if _, err := e.pool.Exec(ctx, `CREATE PUBLICATION `+pubName+` FOR TABLE `+e.schema+`.outbox_events`+tc.with); err != nil {
			t.Fatal(err)
		}
		err := outboxcdc.Setup(ctx, outboxcdc.Config{Pool: e.pool, Schema: e.schema, Group: group, Publication: pubName})
		if err == nil {
			t.Errorf("%s: Setup accepted publication %s (%s), which does not publish every insert into the outbox table", tc.name, pubName, strings.TrimSpace(tc.with))
		}
	}
}

// TestAdvCDCRecoversFromADroppedPublication: a slot dropped by hand is
// created again by the running relay ("a slot that disappeared is created
// again"); a publication dropped by hand is not. The WAL sender then fails
// every session ("publication ... does not exist"), the relay reconnects
// for ever with an ERROR in the server's log each time, and the stream
// publishes nothing again until the process is restarted. The test keeps
// writing events after the drop and wants the stream (no safety net) to
// publish one of them within 45 s.
func TestAdvCDCRecoversFromADroppedPublication(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, nil), nil)
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	e.write(t, "before", 1, 1)
	outboxtest.Eventually(t, 30*time.Second, "published before the drop", func() bool { return c.Stats().Published() == 1 })
	if _, err := e.pool.Exec(ctx, `DROP PUBLICATION `+outboxcdc.PublicationName(e.schema)); err != nil {
		t.Fatal(err)
	}
	e.write(t, "gap", 1, 1)
	outboxtest.Eventually(t, 30*time.Second, "the stream met the missing publication", func() bool { return c.Ready() != nil })
	deadline := time.Now().Add(45 * time.Second)
	for i := 0; c.Stats().Published() < 2; i++ {
		if time.Now().After(deadline) {
			var pubs string
			_ = e.pool.QueryRow(ctx, `SELECT coalesce(string_agg(pubname || ':' || schemaname || '.' || tablename, ','), '') FROM pg_publication_tables`).Scan(&pubs)
			t.Fatalf("the stream published nothing in the 45 s after its publication was dropped (%d events written since, %d received; ready: %v; publications: %s)",
				i, c.Stats().Received(), c.Ready(), pubs)
		}
		// Each on an aggregate of its own: the one written in the gap is
		// for a safety net to publish (none runs), and blocks its lane.
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

// TestAdvCDCEventInvisibleForMoreThanASecond: PostgreSQL streams a commit
// before it is visible. The stream retries an id it does not find for one
// second (missingFor) and then leaves it to the polling path, assuming the
// event was deleted or its backend starved. With synchronous replication
// (synchronous_standby_names), a commit stays invisible until a standby
// confirmed it, while the WAL sender of a logical slot streams it as soon
// as it is flushed locally (PostgreSQL 15): a standby slower than a second
// leaves every event committed meanwhile to the safety net (+
// --reconcile-after each), in a healthy run where "outbox_cdc_events_left_total
// stays 0". Here one writer's commit waits 3 s for a standby (it asks
// synchronous_commit = on; the server's default is local, so the relay's
// own writes do not wait), then the wait is cancelled and the commit becomes
// visible. The stream (no safety net) must publish the event.
func TestAdvCDCEventInvisibleForMoreThanASecond(t *testing.T) {
	t.Parallel()
	e := newEnv(t, map[string]string{"synchronous_standby_names": "adv_nosuch", "synchronous_commit": "local"})
	ctx := context.Background()
	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, nil), nil)
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)

	conn, err := pgx.Connect(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() {
		committed <- pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = on"); err != nil {
				return err
			}
			_, err := e.w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "slow-standby", Type: "Placed", Payload: []byte(`{}`)})
			return err
		})
	}()
	outboxtest.Eventually(t, 30*time.Second, "the stream read the commit", func() bool { return c.Stats().Received() == 1 })
	if e.count(t, "true") != 0 {
		t.Fatal("the commit is visible before its synchronous standby confirmed it: the test's premise does not hold")
	}
	// The standby is slow for 3 s (the fault, not an assertion).
	time.Sleep(3 * time.Second)
	if _, err := e.pool.Exec(ctx, "SELECT pg_cancel_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	if err := <-committed; err != nil && !errors.Is(err, context.Canceled) {
		t.Logf("writer: %v", err)
	}
	if e.count(t, "true") != 1 {
		t.Fatal("the event is not visible after its synchronous wait was cancelled")
	}
	deadline := time.Now().Add(20 * time.Second)
	for e.count(t, "published_at IS NULL") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the stream never published an event whose commit was invisible for 3 s (left to the safety net: %d, none running)", c.Stats().Left())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c.Stats().Left() != 0 {
		t.Fatalf("left %d events to the safety net; a commit waiting for a synchronous standby is not a deleted event", c.Stats().Left())
	}
}
