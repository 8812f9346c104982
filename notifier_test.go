package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestNotifierWakesRelay: a relay that would not poll for an hour
// publishes an event as soon as the writer's Notifier says so.
func TestNotifierWakesRelay(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	n, err := outbox.NewNotifier(pool, outbox.NotifierConfig{Schema: schema, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	cfg := quietConfig(schema, b.pub)
	cfg.PollInterval = time.Hour
	startRelay(t, pool, cfg)
	time.Sleep(200 * time.Millisecond) // the relay's first, empty claim and its LISTEN
	writeEvents(t, pool, w, 1, 1)
	n.Notify()
	outboxtest.Eventually(t, 10*time.Second, "event published after the wake-up", func() bool { return unpublished(t, pool, schema) == 0 })
}

// TestNotifierCoalesces: many concurrent Notify calls cost far fewer
// NOTIFYs, the last call is still followed by one, and Notify after Close
// does nothing.
func TestNotifierCoalesces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{outbox.NotifyChannel(schema)}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	n, err := outbox.NewNotifier(pool, outbox.NotifierConfig{Schema: schema, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				n.Notify()
			}
		}()
	}
	wg.Wait()
	outboxtest.Eventually(t, 10*time.Second, "notifier idle", func() bool {
		st := n.Stats()
		return st.Sent+st.Failed >= 1 && st.Calls == 800
	})
	// At least one notification arrives after the last call.
	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := conn.Conn().WaitForNotification(waitCtx); err != nil {
		t.Fatalf("no notification: %v", err)
	}
	n.Close()
	st := n.Stats()
	if st.Failed != 0 || st.Sent >= 800 {
		t.Fatalf("stats %+v: want no failure and fewer NOTIFYs than calls", st)
	}
	n.Notify()
	time.Sleep(50 * time.Millisecond)
	if after := n.Stats(); after.Sent != st.Sent {
		t.Fatalf("Notify after Close sent a NOTIFY: %+v", after)
	}
}
