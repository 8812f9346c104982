package outboxcdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestSuccessorOfAHeadPublishedElsewhere: a polling relay holds a lane's
// head (its publish held) while the stream reads the head's successor. The
// stream cannot claim it then; it keeps it and hands it over again, and
// publishes it itself soon after the polling relay marked the head, with
// no safety net running at all. The time from the head's mark to the
// successor's is logged.
func TestSuccessorOfAHeadPublishedElsewhere(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	hold := holding(e.pub)
	hold.arm()
	poller, err := outbox.NewRelay(e.pool, outbox.RelayConfig{
		Schema: e.schema, Publisher: hold, ID: "poller", PollInterval: 20 * time.Millisecond, Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	pctx, stopPoller := context.WithCancel(ctx)
	defer stopPoller()
	pollerDone := make(chan error, 1)
	go func() { pollerDone <- poller.Run(pctx) }()
	// The head is written before the slot exists: only the polling relay
	// ever sees it.
	e.write(t, "head", 1, 1)
	outboxtest.Eventually(t, 30*time.Second, "the polling relay holds the head", hold.held.Load)

	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, nil), nil)
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	e.write(t, "next", 1, 1)
	outboxtest.Eventually(t, 30*time.Second, "the stream keeps the successor waiting", func() bool { return c.Stats().Waiting() == 1 })

	// The polling relay stops claiming, publishes and marks the head it
	// holds, and exits: the successor is the stream's to publish.
	stopPoller()
	hold.unhold()
	if err := <-pollerDone; err != nil {
		t.Fatalf("polling relay: %v", err)
	}
	outboxtest.Eventually(t, 30*time.Second, "the stream published the successor", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	checkInvariants(t, e.brokerMessages(t), 2)
	if c.Stats().Published() != 1 || c.Stats().Left() != 0 || c.Stats().Waiting() != 0 {
		t.Fatalf("stream published %d, left %d, waiting %d; want the successor published by the stream",
			c.Stats().Published(), c.Stats().Left(), c.Stats().Waiting())
	}
	var gap time.Duration
	if err := e.pool.QueryRow(ctx, `SELECT max(published_at) - min(published_at) FROM `+e.schema+`.outbox_events`).Scan(&gap); err != nil {
		t.Fatal(err)
	}
	t.Logf("successor marked %s after the head's mark (the polling relay's), by the stream", gap)
}
