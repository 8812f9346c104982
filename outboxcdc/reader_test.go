package outboxcdc_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxcdc"
)

// TestHeldPublishKeepsTheStreamAlive: a publish held far past the server's
// wal_sender_timeout (2 s) does not stop the stream: the reader goes on
// reading the transactions committed meanwhile and answering the server,
// which keeps the same WAL sender and logs no replication timeout; the
// slot is not confirmed past the held events; once released, every event
// is published, in order.
func TestHeldPublishKeepsTheStreamAlive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, map[string]string{"wal_sender_timeout": "2s"})
	hold := holding(e.pub)
	// StatusInterval is the default (10 s): the replies to the server's
	// keepalive requests, every wal_sender_timeout/2, keep it alive.
	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, hold), nil, func(c *outboxcdc.Config) { c.StatusInterval = 0 })
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	slot := outboxcdc.SlotName(e.schema, "g")
	e.write(t, "before", 2, 3)
	outboxtest.Eventually(t, 30*time.Second, "first events published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	pid, _ := e.walSender(t, slot)
	if pid == 0 {
		t.Fatal("no WAL sender streams the slot")
	}
	hold.arm()
	heldFrom := time.Now()
	// The first held transaction commits after this position: the slot
	// must not be confirmed past it before that transaction is published.
	first := e.write(t, "held", 3, 1)
	last := e.write(t, "held", 3, 9)
	outboxtest.Eventually(t, 30*time.Second, "a publish is held", hold.held.Load)
	outboxtest.Eventually(t, 30*time.Second, "the stream read every transaction committed while the publish is held", func() bool {
		return c.Stats().Received() == 6+30
	})
	// Three times wal_sender_timeout with the publish held: the server
	// still gets replies from the same WAL sender's client.
	outboxtest.Eventually(t, 60*time.Second, "the relay answers the server 6 s into the held publish", func() bool {
		p, reply := e.walSender(t, slot)
		if p != pid {
			t.Fatalf("the WAL sender changed from PID %d to %d while the publish was held; server log:\n%s", pid, p, e.cluster.Log())
		}
		return reply.Sub(heldFrom) > 6*time.Second
	})
	if !hold.held.Load() {
		t.Fatal("the publish was released before the end of the test")
	}
	if got := e.confirmed(t, slot); got > first {
		t.Fatalf("slot confirmed at %s, past the first held transaction (%s), while it was not published", got, first)
	}
	hold.unhold()
	outboxtest.Eventually(t, 60*time.Second, "every event published once released", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	outboxtest.Eventually(t, 30*time.Second, "slot confirmed past the last held commit", func() bool { return e.confirmed(t, slot) > last })
	checkInvariants(t, e.brokerMessages(t), 36)
	if p, _ := e.walSender(t, slot); p != pid {
		t.Fatalf("the WAL sender changed from PID %d to %d", pid, p)
	}
	if log := e.cluster.Log(); strings.Contains(log, "replication timeout") {
		t.Fatalf("the server ended the WAL sender for a replication timeout:\n%s", log)
	}
}

// TestFullQueueDefersAndReadsAgain: with the publish held and a queue of
// at most 50 ids, the stream reads on but queues no more; it confirms
// nothing past the transactions it did not queue, and once the queued ids
// are published it reads those transactions again from the slot and
// publishes them, in order, through the stream (no safety net runs).
func TestFullQueueDefersAndReadsAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	hold := holding(e.pub)
	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, hold), nil, func(c *outboxcdc.Config) { c.MaxQueued = 50 })
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	slot := outboxcdc.SlotName(e.schema, "g")
	hold.arm()
	first := e.write(t, "first", 5, 1)
	outboxtest.Eventually(t, 30*time.Second, "a publish is held", hold.held.Load)
	last := e.write(t, "more", 5, 40)
	outboxtest.Eventually(t, 30*time.Second, "the stream read every transaction", func() bool { return c.Stats().Received() == 5*41 })
	if c.Stats().Deferred() == 0 || c.Stats().Queued() > 50 {
		t.Fatalf("queued %d, deferred %d with a queue of 50 and 205 ids read", c.Stats().Queued(), c.Stats().Deferred())
	}
	if got := e.confirmed(t, slot); got > first {
		t.Fatalf("slot confirmed at %s, past the first transaction (%s), with its publish held", got, first)
	}
	hold.unhold()
	outboxtest.Eventually(t, 60*time.Second, "every event published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	outboxtest.Eventually(t, 30*time.Second, "slot confirmed past the last commit", func() bool { return e.confirmed(t, slot) > last })
	checkInvariants(t, e.brokerMessages(t), 205)
	if c.Stats().Rewinds() == 0 || c.Stats().Published() != 205 || c.Stats().Left() != 0 {
		t.Fatalf("rewinds %d, published %d, left %d; want the deferred transactions read again and all 205 published by the stream",
			c.Stats().Rewinds(), c.Stats().Published(), c.Stats().Left())
	}
}
