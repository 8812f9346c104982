package outboxconsole_test

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxconsole"
)

// flakyNATS stands for a NATS destination (it reports a durable JetStream
// acknowledgement) that refuses everything as unavailable until up is set.
type flakyNATS struct{ up atomic.Bool }

func (p *flakyNATS) Publish(_ context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	if !p.up.Load() {
		for i := range errs {
			errs[i] = outbox.Unavailable(errors.New("nats: no servers available for connection"))
		}
	}
	return errs
}

func (p *flakyNATS) Probe(context.Context) error {
	if !p.up.Load() {
		return outbox.Unavailable(errors.New("nats: no servers available for connection"))
	}
	return nil
}

func (p *flakyNATS) CheckDurability(context.Context) (outbox.DurabilityReport, error) {
	return outbox.DurabilityReport{Destination: "nats", Durable: true, Reason: "replicated", Summary: "stream OUTBOX: file storage, 3 replicas"}, nil
}

// TestOverviewShowsRelayAndDestinationHealth: while the destination is
// down, the overview shows the relay and its destination not ready, with
// the reason /readyz gives and since when; once it is back, ready, with the
// last error kept, and the failures in the failures chart.
func TestOverviewShowsRelayAndDestinationHealth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "ord-1", Type: "OrderCreated", Payload: []byte(`{}`)},
			outbox.Event{AggregateType: "order", AggregateID: "ord-2", Type: "OrderCreated", Payload: []byte(`{}`)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	pub := &flakyNATS{}
	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: pub, PollInterval: 20 * time.Millisecond,
		RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond,
		OutageProbeMax: 50 * time.Millisecond, DisableNotify: true, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	c := newClient(t, serve(t, outboxconsole.Config{Pool: pool, Schema: schema, Token: testToken}))
	c.login("alice")
	destRow := regexp.MustCompile(`(?s)<tr data-destination="nats">.*?</tr>`)
	relayRow := regexp.MustCompile(`(?s)<tr data-relay="` + regexp.QuoteMeta(relay.ID()) + `">.*?</tr>`)
	var body string
	outboxtest.Eventually(t, 30*time.Second, "the overview shows the destination not ready", func() bool {
		_, body = c.get("/")
		d, r := destRow.FindString(body), relayRow.FindString(body)
		return strings.Contains(d, "not ready") && strings.Contains(d, "destination unavailable") && strings.Contains(d, "no servers available") &&
			strings.Contains(r, "not ready") && strings.Contains(r, "destination unavailable")
	})
	if d := destRow.FindString(body); !strings.Contains(d, "durable") || !strings.Contains(d, "3 replicas") {
		t.Fatalf("the destination row does not show the acknowledgement's durability:\n%s", d)
	}

	pub.up.Store(true)
	outboxtest.Eventually(t, 30*time.Second, "the overview shows the destination ready, with its last error, and the failures charted", func() bool {
		_, body = c.get("/")
		d := destRow.FindString(body)
		return strings.Contains(d, `<span class="ok">ready</span>`) && strings.Contains(d, "destination unavailable") &&
			strings.Contains(body, `class="minute-chart bad" id="chart-failed"`)
	})
	if code, _ := c.get("/"); code != http.StatusOK {
		t.Fatalf("overview: %d", code)
	}
}

// TestOverviewSplitsOldestPending: the oldest pending event the relays
// could publish and the oldest parked behind a quarantined event are two
// figures; with nothing but parked events pending, the first is empty.
func TestOverviewSplitsOldestPending(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1, 1, 3) // pay-0000: #1 quarantined, #2 and #3 parked behind it
	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema}))
	blocked := regexp.MustCompile(`id="oldest-blocked">([^<]+)<`)
	// The relay parks the events behind the quarantined one (at once, or
	// at its lane sweep): then only the second figure is set.
	outboxtest.Eventually(t, 30*time.Second, "the oldest pending empty and the oldest blocked set", func() bool {
		_, body := c.get("/")
		m := blocked.FindStringSubmatch(body)
		return strings.Contains(body, `id="oldest">—<`) && m != nil && m[1] != "—"
	})
	// The audit log's detail column wraps (it is a fixed layout table).
	css := func() string { _, b := c.get("/static/console.css"); return b }()
	if !strings.Contains(css, "table.operations { table-layout: fixed; }") || !strings.Contains(css, "overflow-wrap: anywhere") {
		t.Error("the operations table's columns do not wrap")
	}
}
