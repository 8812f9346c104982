package outboxcdc_test

import (
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxcdc"
)

// TestStreamFailsAtEachBoundary makes the CDC stream fail once at each of its
// boundaries (failpoints, process-wide: this test is not parallel, so it
// runs before the parallel ones) and checks that it restarts from the
// slot's confirmed position with nothing lost and every aggregate in order.
//
//   - cdc/before-publish: ids received, nothing published or confirmed. The
//     replay publishes them, each once.
//   - cdc/before-confirm: published and marked, not confirmed. The replay
//     hands the same ids over again; the table says they are published, so
//     they are left and nothing is sent twice.
//   - relay/after-ack-before-mark: acknowledged by the broker, not marked,
//     the lease still held. The stream retries, finds them leased (by its
//     own relay, which it does not take for an acknowledgement), keeps them
//     waiting and republishes them when the lease expires, or the safety
//     net does: duplicates at the broker, first deliveries in order.
//
// The same boundaries with SIGKILL instead of an error are NOT tested yet
// (they need `outbox relay --mode cdc` run as a process).
func TestStreamFailsAtEachBoundary(t *testing.T) {
	cases := []struct {
		failpoint string
		check     func(t *testing.T, c *outboxcdc.Relay, seen map[[16]byte]int)
	}{
		{"cdc/before-publish", func(t *testing.T, c *outboxcdc.Relay, seen map[[16]byte]int) {
			if c.Stats().Published() != 30 {
				t.Fatalf("the stream published %d of 30 events; the replay from the unconfirmed position should have published all", c.Stats().Published())
			}
			for id, n := range seen {
				if n != 1 {
					t.Fatalf("event %x delivered %d times; nothing was published before the failure", id, n)
				}
			}
		}},
		{"cdc/before-confirm", func(t *testing.T, c *outboxcdc.Relay, seen map[[16]byte]int) {
			if c.Stats().AlreadyPublished() == 0 {
				t.Fatal("no id was found published: the stream did not restart from the unconfirmed position")
			}
			if c.Stats().Left() != 0 {
				t.Fatalf("%d ids left to the safety net; the ones read again are published, not left", c.Stats().Left())
			}
			for id, n := range seen {
				if n != 1 {
					t.Fatalf("event %x delivered %d times; the replay should find it published", id, n)
				}
			}
		}},
		{"relay/after-ack-before-mark", func(t *testing.T, c *outboxcdc.Relay, seen map[[16]byte]int) {
			dup := 0
			for _, n := range seen {
				if n > 1 {
					dup++
				}
			}
			if dup == 0 {
				t.Fatal("no duplicate: the acknowledged, unmarked events were not republished")
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.failpoint, func(t *testing.T) {
			e := newEnv(t, nil)
			if err := failpoint.Enable(tc.failpoint+"=error@1", 1); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = failpoint.Enable("", 0) })
			c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, nil), e.relay(t, "net", 2*time.Second, nil))
			outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
			last := e.write(t, "x", 3, 10)
			outboxtest.Eventually(t, 30*time.Second, "all published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
			slot := outboxcdc.SlotName(e.schema, "g")
			outboxtest.Eventually(t, 30*time.Second, "slot confirmed past the last commit", func() bool { return e.confirmed(t, slot) > last })
			if failpoint.Fired(tc.failpoint) != 1 {
				t.Fatalf("failpoint %s fired %d times, want 1", tc.failpoint, failpoint.Fired(tc.failpoint))
			}
			seen := checkInvariants(t, e.brokerMessages(t), 30)
			bySeen := map[[16]byte]int{}
			for id, n := range seen {
				bySeen[id] = n
			}
			tc.check(t, c, bySeen)
		})
	}
}
