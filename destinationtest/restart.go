package destinationtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
)

// restart publishes batches without pause while the broker is stopped and
// started again: every message reported as succeeded must be there
// afterwards, and no failure may be permanent.
func restart(t *testing.T, d Destination) {
	tg := open(t, d.OpenRestartable)
	if tg.Restart == nil {
		t.Fatal("destinationtest: OpenRestartable returned a Target without Restart")
	}
	ctx := testCtx(t, 3*time.Minute)

	const batch, before, after = 8, 10, 10
	var (
		mu        sync.Mutex
		succeeded []uuid.UUID
		failed    int
		restarted = make(chan struct{})
		warmed    = make(chan struct{})
	)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			okBatches, okAfter := 0, 0
			for i := 0; ; i++ {
				select {
				case <-stop:
					return nil
				default:
				}
				msgs := make([]outbox.Message, batch)
				for j := range msgs {
					msgs[j] = message(fmt.Sprintf("r-%d-%d", i, j), 1)
				}
				callCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
				errs := tg.Publisher.Publish(callCtx, msgs)
				cancel()
				allOK := true
				mu.Lock()
				for j, m := range msgs {
					var err error
					if errs != nil {
						err = errs[j]
					}
					if err == nil {
						succeeded = append(succeeded, m.ID)
						continue
					}
					allOK = false
					failed++
					if outbox.IsPermanent(err) {
						mu.Unlock()
						return fmt.Errorf("message %s failed as permanent during the restart: %w", m.ID, err)
					}
				}
				mu.Unlock()
				if !allOK {
					if ctx.Err() != nil {
						return fmt.Errorf("broker did not come back: %w", ctx.Err())
					}
					time.Sleep(20 * time.Millisecond) // backoff, as a relay would
					continue
				}
				okBatches++
				if okBatches == before {
					close(warmed)
				}
				select {
				case <-restarted:
					if okAfter++; okAfter == after {
						return nil
					}
				default:
				}
			}
		}()
	}()

	select {
	case <-warmed:
	case err := <-done:
		t.Fatalf("publishing before the restart: %v", err)
	}
	tg.Restart(t)
	close(restarted)
	if err := <-done; err != nil {
		close(stop)
		t.Fatal(err)
	}
	close(stop)

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d messages succeeded, %d failed while the broker restarted", len(succeeded), failed)
	readCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ds, err := tg.Read(readCtx, len(succeeded))
	if err != nil && readCtx.Err() == nil {
		t.Fatalf("read back: %v", err)
	}
	there := map[uuid.UUID]bool{}
	for _, dv := range ds {
		there[dv.Message.ID] = true
	}
	lost := 0
	for _, id := range succeeded {
		if !there[id] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d messages reported as succeeded are not at the destination after the restart", lost, len(succeeded))
	}
}
