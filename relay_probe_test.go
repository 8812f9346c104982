package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// failOnce is the real NATS publisher, except that its first Publish fails
// as unavailable (a broker blip seen by this relay only). Probe is the real
// publisher's.
type failOnce struct {
	*outboxnats.Publisher
	once   sync.Once
	failed chan struct{}
}

func (p *failOnce) Publish(ctx context.Context, msgs []outbox.Message) []error {
	var errs []error
	p.once.Do(func() {
		errs = make([]error, len(msgs))
		for i := range errs {
			errs[i] = outbox.Unavailable(errors.New("blip"))
		}
		close(p.failed)
	})
	if errs != nil {
		return errs
	}
	return p.Publisher.Publish(ctx, msgs)
}

// TestIdleRelayBecomesReadyWhenDestinationIsBack: relay A sees the
// destination unavailable once; relay B then publishes the event. A, with
// nothing left to publish, probes the destination and is ready again,
// without publishing anything itself.
func TestIdleRelayBecomesReadyWhenDestinationIsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	writeEvents(t, pool, w, 1, 1)

	pubA := &failOnce{Publisher: b.pub, failed: make(chan struct{})}
	cfgA := quietConfig(schema, pubA)
	// A backs off (and backs the event off) for an hour: only a wake-up
	// makes it look again, and the event is B's to publish.
	cfgA.RetryBackoffMin, cfgA.RetryBackoffMax = time.Hour, time.Hour
	cfgA.PollInterval = time.Hour
	cfgA.DisableNotify = true
	relayA, _ := startRelay(t, pool, cfgA)
	<-pubA.failed
	outboxtest.Eventually(t, 10*time.Second, "A recorded the outage and is not ready", func() bool {
		var recorded bool
		_ = pool.QueryRow(ctx, `SELECT last_error IS NOT NULL FROM `+schema+`.outbox_events`).Scan(&recorded)
		err := relayA.Ready()
		return recorded && err != nil && strings.Contains(err.Error(), "destination unavailable")
	})

	// The backoff passes; B publishes the event.
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET available_at = now()`); err != nil {
		t.Fatal(err)
	}
	cfgB := quietConfig(schema, b.pub)
	cfgB.DisableNotify = true
	relayB, stopB := startRelay(t, pool, cfgB)
	outboxtest.Eventually(t, 10*time.Second, "B published the event", func() bool { return unpublished(t, pool, schema) == 0 })
	stopB()
	if relayB.Stats().Published != 1 {
		t.Fatalf("B published %d events, want 1", relayB.Stats().Published)
	}

	// A looks again, finds nothing to publish, and is ready.
	relayA.Wake()
	outboxtest.Eventually(t, 10*time.Second, "A ready again", func() bool { return relayA.Ready() == nil })
	if st := relayA.Stats(); st.Published != 0 || st.Failed != 1 {
		t.Fatalf("A stats %+v: want nothing published, one failure", st)
	}
}
