package outbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestRetryAfterIsHonoured: a failure marked with outbox.RetryAfter backs
// its event off for at least that delay, retryable or unavailable, where
// the relay's own backoff would have retried it within milliseconds.
func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	for name, mark := range map[string]func(error) error{
		"retryable":   func(err error) error { return outbox.RetryAfter(err, 30*time.Second) },
		"unavailable": func(err error) error { return outbox.Unavailable(outbox.RetryAfter(err, 30*time.Second)) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, schema := outboxtest.Schema(t)
			w := newWriter(t, schema)
			b := newNATS(t, outboxtest.NATSURL(), 0)
			var refused atomic.Int64
			pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
				if m.AggregateID == "agg-0" {
					refused.Add(1)
					return mark(errors.New("429 slow down"))
				}
				return nil
			}}
			writeEvents(t, pool, w, 2, 1)
			startRelay(t, pool, quietConfig(schema, pub)) // backoff 10-100 ms
			outboxtest.Eventually(t, 30*time.Second, "agg-1 published, agg-0 backed off", func() bool { return unpublished(t, pool, schema) == 1 && refused.Load() > 0 })
			var wait time.Duration
			if err := pool.QueryRow(context.Background(), `SELECT extract(epoch FROM available_at - now()) * interval '1 second'
				FROM `+schema+`.outbox_events WHERE aggregate_id = 'agg-0'`).Scan(&wait); err != nil {
				t.Fatal(err)
			}
			if wait < 25*time.Second || wait > 31*time.Second {
				t.Fatalf("agg-0 is due again in %s, want about 30s (the Retry-After)", wait)
			}
			if n := refused.Load(); n != 1 {
				t.Fatalf("agg-0 was tried %d times, want once within its Retry-After", n)
			}
		})
	}
}
