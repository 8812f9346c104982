package outboxamqp_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// TestBrokerRestart: batches are published in a loop while the test's own
// RabbitMQ node is stopped and started again. Every message Publish reported
// as stored is in the durable queue afterwards; the failures during the
// outage are unavailable or retryable, never permanent; and the publisher
// reconnects by itself on a later Publish.
func TestBrokerRestart(t *testing.T) {
	node := rabbittest.Start(t)
	// A classic durable queue: it keeps a message across the restart only
	// if it was published persistent. A dial to the stopped node is refused
	// at once; DialTimeout (10 s) is room for the probe after the restart
	// on a loaded machine (1 s was not).
	p, b := setupQueue(t, node.URL(), outboxamqp.Config{ConfirmTimeout: 3 * time.Second, DialTimeout: 10 * time.Second}, false, "outbox.order")

	var (
		mu      sync.Mutex
		stored  = map[string]bool{}
		okCalls int // calls in which every message was stored
		failed  int // messages that failed
		unavail int // of which unavailable
	)
	progress := make(chan struct{}, 1) // a call finished
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		for batch := 0; ctx.Err() == nil; batch++ {
			msgs := make([]outbox.Message, 5)
			for i := range msgs {
				msgs[i] = event(fmt.Sprintf("b%d-%d", batch, i), 1)
			}
			errs := p.Publish(context.Background(), msgs)
			mu.Lock()
			if errs == nil {
				okCalls++
			}
			for i, err := range errs {
				if err == nil {
					continue
				}
				if outbox.IsPermanent(err) {
					mu.Unlock()
					done <- fmt.Errorf("batch %d message %d: permanent error during a restart: %v", batch, i, err)
					return
				}
				failed++
				if outbox.IsUnavailable(err) {
					unavail++
				}
			}
			for i := range msgs {
				if errs == nil || errs[i] == nil {
					stored[msgs[i].ID.String()] = true
				}
			}
			mu.Unlock()
			select {
			case progress <- struct{}{}:
			default:
			}
			if errs != nil {
				time.Sleep(20 * time.Millisecond) // paces the retries, as the relay's backoff does
			}
		}
		done <- nil
	}()
	// waitFor blocks until cond holds after a finished call.
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.After(45 * time.Second)
		for {
			mu.Lock()
			ok := cond()
			mu.Unlock()
			if ok {
				return
			}
			select {
			case <-progress:
			case err := <-done:
				t.Fatalf("publisher loop ended waiting for %s: %v", what, err)
			case <-deadline:
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("stored batches before the restart", func() bool { return okCalls >= 5 })
	node.Stop()
	waitFor("failures while the node is down", func() bool { return failed >= 10 })
	mu.Lock()
	before := okCalls
	mu.Unlock()
	if err := p.Probe(context.Background()); !outbox.IsUnavailable(err) {
		t.Errorf("Probe while the node is down: %v, want unavailable", err)
	}
	node.Start()
	if err := p.Probe(context.Background()); err != nil {
		t.Errorf("Probe after the restart: %v", err)
	}
	waitFor("stored batches after the restart", func() bool { return okCalls >= before+5 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// A memory alarm blocks publishing connections: the messages are not
	// confirmed and fail as unavailable, until the alarm clears.
	node.Ctl("set_vm_memory_high_watermark", "0")
	errs := p.Publish(context.Background(), []outbox.Message{event("alarm-1", 1), event("alarm-2", 1)})
	if len(errs) != 2 || !outbox.IsUnavailable(errs[0]) || !outbox.IsUnavailable(errs[1]) {
		t.Errorf("Publish during a memory alarm: %v, want unavailable", errs)
	}
	node.Ctl("set_vm_memory_high_watermark", "0.4")
	alarmDone := time.Now().Add(20 * time.Second)
	for {
		errs := p.Publish(context.Background(), []outbox.Message{event("after-alarm", 1)})
		if errs == nil {
			break
		}
		if !outbox.IsUnavailable(errs[0]) || time.Now().After(alarmDone) {
			t.Fatalf("Publish after the memory alarm cleared: %v", errs)
		}
		time.Sleep(50 * time.Millisecond) // the broker unblocks the connection on its own
	}

	b.reconnect(t)
	mu.Lock()
	defer mu.Unlock()
	if unavail == 0 {
		t.Errorf("none of the %d failures during the outage was unavailable", failed)
	}
	if n := b.count(t); n < len(stored) {
		t.Errorf("queue holds %d messages, Publish reported %d stored", n, len(stored))
	}
	seen := map[string]bool{}
	for _, d := range b.read(t, b.count(t)) {
		seen[d.MessageId] = true
	}
	for id := range stored {
		if !seen[id] {
			t.Errorf("event %s was reported stored but is not in the queue", id)
		}
	}
	t.Logf("%d messages stored, %d failed during the outage (%d unavailable, the others retryable)", len(stored), failed, unavail)
}
