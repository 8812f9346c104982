package outboxcdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestCDCOnPartitionedOutbox: on a partitioned outbox_events the stream
// reads the inserts into the partitions as the parent's (the publication
// has publish_via_partition_root) and publishes all of them in order, none
// left to the safety net.
func TestCDCOnPartitionedOutbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	if _, err := outboxmigrate.Partition(context.Background(), e.pool, e.schema, outboxmigrate.PartitionConfig{Interval: time.Minute, Ahead: 3}); err != nil {
		t.Fatal(err)
	}
	c, _ := e.startCDC(t, "main", e.relay(t, "cdc", 0, nil), nil)
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	e.write(t, "w", 4, 20)
	total := 4 * 20
	outboxtest.Eventually(t, 60*time.Second, "all published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	checkInvariants(t, e.brokerMessages(t), total)
	if got := c.Stats().Published(); got != int64(total) {
		t.Fatalf("CDC published %d events, want all %d", got, total)
	}
}
