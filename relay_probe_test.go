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
// as unavailable (a broker blip seen by this relay only), and its Probe
// fails until probeOK is closed.
type failOnce struct {
	*outboxnats.Publisher
	once    sync.Once
	failed  chan struct{}
	probeOK chan struct{}
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

func (p *failOnce) Probe(ctx context.Context) error {
	select {
	case <-p.probeOK:
		return p.Publisher.Probe(ctx)
	default:
		return outbox.Unavailable(errors.New("still down"))
	}
}

// TestIdleRelayBecomesReadyWhenDestinationIsBack: relay A sees the
// destination unavailable, and its probes fail too: it is not ready, and
// claims nothing meanwhile (the event it failed was released untouched).
// Relay B then publishes the event. Once A's probe succeeds, A, with nothing
// left to publish, is ready again without publishing anything itself.
func TestIdleRelayBecomesReadyWhenDestinationIsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	writeEvents(t, pool, w, 1, 1)

	pubA := &failOnce{Publisher: b.pub, failed: make(chan struct{}), probeOK: make(chan struct{})}
	cfgA := quietConfig(schema, pubA)
	cfgA.OutageProbeMax = 50 * time.Millisecond
	destA := &destinationRecorder{}
	cfgA.Observer = destA
	cfgA.DisableNotify = true
	relayA, _ := startRelay(t, pool, cfgA)
	<-pubA.failed
	outboxtest.Eventually(t, 10*time.Second, "A is in an outage and not ready", func() bool {
		err := relayA.Ready()
		return err != nil && strings.Contains(err.Error(), "destination unavailable") && strings.Contains(err.Error(), "still down")
	})
	if o := destA.last(); !o.Unavailable {
		t.Fatalf("A not ready, but its DestinationObserver was told %+v", o)
	}
	var untouched bool
	if err := pool.QueryRow(ctx, `SELECT available_at <= now() AND attempt_count = 0 AND last_error IS NULL AND claim_token IS NULL
		FROM `+schema+`.outbox_events`).Scan(&untouched); err != nil {
		t.Fatal(err)
	}
	if !untouched {
		t.Fatal("the event that met the outage was not released untouched")
	}

	cfgB := quietConfig(schema, b.pub)
	cfgB.DisableNotify = true
	relayB, stopB := startRelay(t, pool, cfgB)
	outboxtest.Eventually(t, 10*time.Second, "B published the event", func() bool { return unpublished(t, pool, schema) == 0 })
	stopB()
	if relayB.Stats().Published != 1 {
		t.Fatalf("B published %d events, want 1", relayB.Stats().Published)
	}

	// A's probe succeeds, it finds nothing to publish, and is ready.
	close(pubA.probeOK)
	outboxtest.Eventually(t, 10*time.Second, "A ready again", func() bool { return relayA.Ready() == nil && !destA.last().Unavailable })
	if st := relayA.Stats(); st.Published != 0 || st.Failed != 1 || st.Outages < 2 {
		t.Fatalf("A stats %+v: want nothing published, one failure, the outage counted", st)
	}
}

// destinationRecorder is a DestinationObserver keeping the last
// observation.
type destinationRecorder struct {
	mu sync.Mutex
	o  outbox.DestinationObservation
}

func (d *destinationRecorder) ObserveDestination(o outbox.DestinationObservation) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.o = o
}

func (d *destinationRecorder) last() outbox.DestinationObservation {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.o
}
