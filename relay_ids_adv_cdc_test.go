package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// gateAll holds every Publish call until its context ends: a polling relay
// whose publish of a claimed event is in flight.
type gateAll struct{ entered chan struct{} }

func (g gateAll) Publish(ctx context.Context, msgs []outbox.Message) []error {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	errs := make([]error, len(msgs))
	for i := range errs {
		errs[i] = ctx.Err()
	}
	return errs
}

// TestAdvPublishIDsNeverMarksASuccessorWhileItsPredecessorIsNot:
// docs/design.md ("Marks in the background") promises that the table never
// shows k+1 published while k is not: a call waits for the previous call's
// marks before it settles its own. The wait is for the marks to be
// *written*, not for them to have *landed*: a fenced mark that finds its
// lease taken over (the mark was slower than the lease: a paused process, a
// stalled connection that pgretry retries until the lease ends) changes
// nothing and returns no error. Meanwhile the next call claimed k+1
// counting k as published ($5), and marks it. The table then shows k+1
// published, k unpublished and leased by a polling relay that publishes it
// again; were that publish refused for good, k would be quarantined behind
// a published successor.
func TestAdvPublishIDsNeverMarksASuccessorWhileItsPredecessorIsNot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	k := writeEvents(t, pool, w, 1, 1)[0] // agg-0, sequence 1
	cfg := quietConfig(schema, b.pub)
	cfg.ID, cfg.LeaseDuration = "cdc", time.Second
	r, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	release := outbox.HoldBackgroundMarks(r)
	defer release()

	// k is acknowledged; its mark is slower than its lease.
	if res, err := r.PublishIDs(ctx, []uuid.UUID{k.ID}); err != nil || res.Published != 1 {
		t.Fatalf("first call: %+v, %v; want k published", res, err)
	}
	outboxtest.Eventually(t, 30*time.Second, "k's lease ended with its mark not written", func() bool {
		var expired bool
		if err := pool.QueryRow(ctx, `SELECT claim_until < now() FROM `+schema+`.outbox_events WHERE event_id = $1`, k.ID).Scan(&expired); err != nil {
			t.Fatal(err)
		}
		return expired
	})
	// A polling relay takes k over (its lease ended) and is publishing it.
	gate := gateAll{entered: make(chan struct{}, 1)}
	pcfg := quietConfig(schema, gate)
	pcfg.ID, pcfg.PollInterval, pcfg.LeaseDuration, pcfg.ShutdownTimeout = "poll", 5*time.Millisecond, time.Minute, 100*time.Millisecond
	_, stopPoll := startRelay(t, pool, pcfg)
	defer stopPoll()
	select {
	case <-gate.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the polling relay did not take k over")
	}
	// k+1 is written; the next call claims it behind k (being marked) and
	// publishes it, and waits for k's mark before it settles its own.
	next := writeEvents(t, pool, w, 1, 1)[0] // agg-0, sequence 2
	second := make(chan error, 1)
	go func() {
		_, err := r.PublishIDs(ctx, []uuid.UUID{next.ID})
		second <- err
	}()
	outboxtest.Eventually(t, 30*time.Second, "k+1 at the broker", func() bool { return len(b.streamEvents(t)) == 2 })

	release()
	// The second call may report k's lost mark (its own events then keep
	// their lease): what it must not do is mark k+1.
	if err := <-second; err != nil {
		t.Logf("second call: %v", err)
	}
	if err := r.WaitPublishIDs(ctx); err != nil {
		t.Logf("marks: %v", err)
	}
	var kPublished, nextPublished bool
	if err := pool.QueryRow(ctx, `SELECT bool_or(published_at IS NOT NULL) FILTER (WHERE aggregate_sequence = 1),
		bool_or(published_at IS NOT NULL) FILTER (WHERE aggregate_sequence = 2)
		FROM `+schema+`.outbox_events`).Scan(&kPublished, &nextPublished); err != nil {
		t.Fatal(err)
	}
	if nextPublished && !kPublished {
		t.Fatalf("the table shows k+1 published while k is not (lease conflicts: %d): a successor was marked behind a mark that never landed",
			r.Stats().LeaseConflicts)
	}
}
