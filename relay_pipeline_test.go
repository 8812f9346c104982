package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// serialPipeliner declares ordered pipelining and keeps its promise the
// simplest way: it sends each aggregate's messages of a call one after the
// other to the real NATS publisher, stopping at the aggregate's first
// failure. It records the longest run of one aggregate's events in a call.
type serialPipeliner struct {
	next outbox.Publisher
	fail func(m outbox.Message) error

	mu      sync.Mutex
	longest int
}

func (p *serialPipeliner) OrderedPipelining() bool { return true }

func (p *serialPipeliner) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	failed := map[string]bool{}
	run, longest := 0, 0
	for i, m := range msgs {
		if i > 0 && msgs[i-1].AggregateID == m.AggregateID {
			run++
			if m.Sequence != msgs[i-1].Sequence+1 {
				errs[i] = errors.New("test: lane out of sequence order in the call")
			}
		} else {
			run = 1
		}
		longest = max(longest, run)
		if errs[i] != nil {
			continue
		}
		if failed[m.AggregateID] {
			errs[i] = errors.New("test: not sent after its aggregate's failure")
			continue
		}
		if errs[i] = p.fail(m); errs[i] == nil {
			if res := p.next.Publish(ctx, []outbox.Message{m}); res != nil {
				errs[i] = res[0]
			}
		}
		failed[m.AggregateID] = errs[i] != nil
	}
	p.mu.Lock()
	p.longest = max(p.longest, longest)
	p.mu.Unlock()
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// TestPipelinedRelayKeepsOrderAndReleasesBehindAFailure: to a publisher that
// declares ordered pipelining the relay passes a lane's events in one call,
// in sequence order; when one fails, it alone spends an attempt and the
// events behind it are released and sent after it, in order. With
// DisablePipelining it goes back to one event per aggregate per call.
func TestPipelinedRelayKeepsOrderAndReleasesBehindAFailure(t *testing.T) {
	t.Parallel()
	for _, disabled := range []bool{false, true} {
		name := map[bool]string{false: "pipelined", true: "disabled"}[disabled]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, schema := outboxtest.Schema(t)
			w := newWriter(t, schema)
			b := newNATS(t, outboxtest.NATSURL(), 0)
			var mu sync.Mutex
			failures := 0
			pub := &serialPipeliner{next: b.pub, fail: func(m outbox.Message) error {
				mu.Lock()
				defer mu.Unlock()
				if m.AggregateID == "agg-1" && m.Sequence == 3 && failures < 2 {
					failures++
					return errors.New("broker said no")
				}
				return nil
			}}
			writeEvents(t, pool, w, 4, 10)
			cfg := quietConfig(schema, pub)
			cfg.BatchSize = 40
			cfg.DisablePipelining = disabled
			startRelay(t, pool, cfg)
			outboxtest.Eventually(t, 30*time.Second, "all published", func() bool { return unpublished(t, pool, schema) == 0 })

			var failedAttempts, otherAttempts int
			if err := pool.QueryRow(context.Background(), `SELECT
				coalesce(sum(attempt_count) FILTER (WHERE aggregate_id = 'agg-1' AND aggregate_sequence = 3), 0),
				coalesce(sum(attempt_count) FILTER (WHERE NOT (aggregate_id = 'agg-1' AND aggregate_sequence = 3)), 0)
				FROM `+schema+`.outbox_events`).Scan(&failedAttempts, &otherAttempts); err != nil {
				t.Fatal(err)
			}
			if failedAttempts != 2 || otherAttempts != 0 {
				t.Errorf("attempts: failing event %d, all others %d; want 2 and 0", failedAttempts, otherAttempts)
			}
			if seen := checkBrokerOrder(t, b.streamEvents(t)); len(seen) != 40 {
				t.Errorf("%d events at the broker, want 40", len(seen))
			}
			pub.mu.Lock()
			longest := pub.longest
			pub.mu.Unlock()
			if disabled && longest != 1 {
				t.Errorf("DisablePipelining: a call held %d events of one aggregate, want 1", longest)
			}
			if !disabled && longest < 2 {
				t.Errorf("pipelined: no call held more than %d event of one aggregate", longest)
			}
		})
	}
}
