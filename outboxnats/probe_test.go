package outboxnats_test

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// TestProbeFollowsTheBroker: Probe succeeds while the server and stream are
// there, fails as unavailable while the server is down or the stream is
// gone, and succeeds again once the server is back.
func TestProbeFollowsTheBroker(t *testing.T) {
	t.Parallel()
	e := natstest.Embedded(t)
	nc := natstest.Connect(t, e.ClientURL())
	js := natstest.JetStream(t, nc)
	p := natstest.Publisher(t, js, outboxnats.Config{})
	ctx := testCtx(t)
	if err := p.Probe(ctx); err != nil {
		t.Fatalf("server up: Probe = %v", err)
	}

	status := nc.StatusChanged(nats.RECONNECTING, nats.CONNECTED)
	defer nc.RemoveStatusListener(status)
	e.Shutdown()
	waitStatus(t, status, nats.RECONNECTING)
	if err := p.Probe(ctx); !outbox.IsUnavailable(err) {
		t.Fatalf("server down: Probe = %v, want unavailable", err)
	}

	e2, err := outboxnats.StartEmbedded(e.StoreDir(), e.Port())
	if err != nil {
		t.Fatalf("restart embedded server: %v", err)
	}
	t.Cleanup(e2.Shutdown)
	waitStatus(t, status, nats.CONNECTED)
	if err := p.Probe(ctx); err != nil {
		t.Fatalf("server back: Probe = %v", err)
	}

	if err := js.DeleteStream(ctx, p.Stream()); err != nil {
		t.Fatal(err)
	}
	if err := p.Probe(ctx); !outbox.IsUnavailable(err) {
		t.Fatalf("stream deleted: Probe = %v, want unavailable", err)
	}
	nc.Close()
}
