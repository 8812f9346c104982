package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// throttlingEndpoint answers 503 with Retry-After: 1 to the first request
// of each event in throttle, and 204 to everything else, and records when.
type throttlingEndpoint struct {
	srv      *httptest.Server
	mu       sync.Mutex
	throttle map[string]bool        // webhook-id → answer 503 once
	refused  map[string]time.Time   // webhook-id → when it was answered 503
	accepted map[string]time.Time   // webhook-id → when it was first accepted
	order    []string               // webhook-ids in the order first accepted
	answers  map[string][]time.Time // webhook-id → every request's time
}

func newThrottlingEndpoint(t *testing.T) *throttlingEndpoint {
	e := &throttlingEndpoint{throttle: map[string]bool{}, refused: map[string]time.Time{}, accepted: map[string]time.Time{},
		answers: map[string][]time.Time{}}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(outboxwebhook.HeaderWebhookID)
		now := time.Now()
		e.mu.Lock()
		defer e.mu.Unlock()
		e.answers[id] = append(e.answers[id], now)
		if e.throttle[id] {
			delete(e.throttle, id)
			e.refused[id] = now
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if _, ok := e.accepted[id]; !ok {
			e.accepted[id] = now
			e.order = append(e.order, id)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// TestThrottledEventsDoNotMakeAnOutage (issue 19, item 7, second face): an
// endpoint that answers a few requests 503 with Retry-After while it takes
// the rest. Every batch publishes, so the relay is never in an outage (no
// relay-wide backoff between batches); each throttled event alone waits its
// Retry-After, spending no attempt, and is then published; no other event is
// delayed at all; each aggregate's events arrive in order.
func TestThrottledEventsDoNotMakeAnOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	const aggregates, perAggregate = 100, 5
	writeEvents(t, pool, w, aggregates, perAggregate)

	e := newThrottlingEndpoint(t)
	// Every 20th aggregate's second event is throttled on its first try.
	laneOf := map[string]string{} // event id → aggregate id
	seqNo := map[string]int64{}   // event id → sequence
	rows, err := pool.Query(ctx, `SELECT event_id::text, aggregate_id, aggregate_sequence FROM `+schema+`.outbox_events`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, agg string
		var seq int64
		if err := rows.Scan(&id, &agg, &seq); err != nil {
			t.Fatal(err)
		}
		laneOf[id], seqNo[id] = agg, seq
		if n, err := strconv.Atoi(strings.TrimPrefix(agg, "agg-")); err == nil && n%20 == 0 && seq == 2 {
			e.throttle[id] = true
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	throttled := len(e.throttle)
	if throttled != aggregates/20 {
		t.Fatalf("%d events to throttle, want %d", throttled, aggregates/20)
	}

	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	pub, err := outboxwebhook.NewPublisher(outboxwebhook.Config{URL: e.srv.URL + "/hook",
		Secrets: []string{"whsec_" + base64.StdEncoding.EncodeToString(secret)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	logs := newLogRecorder()
	// The relay's own backoff is a minute: an event retried within seconds
	// was delayed by its Retry-After, not by a backoff of the relay's.
	cfg := outbox.RelayConfig{Schema: schema, Publisher: pub, BatchSize: 50, PollInterval: 100 * time.Millisecond,
		RetryBackoffMin: time.Minute, RetryBackoffMax: time.Minute, Logger: slog.New(logs)}
	startRelay(t, pool, cfg)
	outboxtest.Eventually(t, 60*time.Second, "everything published", func() bool { return unpublished(t, pool, schema) == 0 })

	if n := logs.count("destination unavailable"); n > 0 {
		t.Errorf("the relay went into a relay-wide outage %d times while every batch published; warnings: %s", n, logs)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.refused) != throttled {
		t.Fatalf("%d events throttled, want %d", len(e.refused), throttled)
	}
	for id, at := range e.refused {
		gap := e.accepted[id].Sub(at)
		if gap < 900*time.Millisecond || gap > 30*time.Second {
			t.Errorf("throttled event %s (%s/%d) was accepted %s after its 503, want after its Retry-After (1s), not after the relay's backoff (1m)",
				id, laneOf[id], seqNo[id], gap.Round(time.Millisecond))
		}
	}
	// No event spent an attempt; none but the throttled ones was delayed.
	// An event claimed behind a throttled one in its lane is released
	// unsent, due at once (its available_at moves to the release): it was
	// not delayed if it was due before its throttled predecessor was
	// accepted.
	throttledAt := map[string]time.Time{} // aggregate → when its throttled event was accepted
	for id := range e.refused {
		throttledAt[laneOf[id]] = e.accepted[id]
	}
	rows, err = pool.Query(ctx, `SELECT event_id::text, attempt_count, available_at = occurred_at, available_at FROM `+schema+`.outbox_events`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var attempts int
		var untouched bool
		var availableAt time.Time
		if err := rows.Scan(&id, &attempts, &untouched, &availableAt); err != nil {
			t.Fatal(err)
		}
		_, wasThrottled := e.refused[id]
		if attempts != 0 {
			t.Errorf("event %s (%s/%d) spent %d attempts", id, laneOf[id], seqNo[id], attempts)
		}
		if wasThrottled || untouched {
			continue
		}
		if head, ok := throttledAt[laneOf[id]]; !ok || seqNo[id] <= 2 || availableAt.After(head) {
			t.Errorf("event %s (%s/%d) was not throttled but its available_at moved to %s",
				id, laneOf[id], seqNo[id], availableAt.Format(time.RFC3339Nano))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	for _, id := range e.order {
		if seqNo[id] != last[laneOf[id]]+1 {
			t.Fatalf("aggregate %s: event %d accepted after %d", laneOf[id], seqNo[id], last[laneOf[id]])
		}
		last[laneOf[id]] = seqNo[id]
	}
	if len(e.order) != aggregates*perAggregate {
		t.Fatalf("%d events accepted, want %d", len(e.order), aggregates*perAggregate)
	}
}
