package destination

import (
	"context"
	"errors"
	"testing"

	"github.com/pgoutbox/outbox"
)

// TestUntilReachable: OpenWait's retry contract. Only Unavailable failures
// go to retry; retry's nil tries again and its error is returned; a nil
// retry or an ended ctx tries once.
func TestUntilReachable(t *testing.T) {
	down := outbox.Unavailable(errors.New("down"))
	bad := errors.New("bad URL")
	stop := errors.New("stop")
	// fails returns a try that fails with errs in turn, then succeeds.
	fails := func(tries *int, errs ...error) func() error {
		return func() error {
			*tries++
			if *tries <= len(errs) {
				return errs[*tries-1]
			}
			return nil
		}
	}
	ctx := context.Background()
	var tries, retries int
	retry := func(_ context.Context, err error) error {
		retries++
		if !errors.Is(err, down) {
			t.Errorf("retry got %v, want the Unavailable error", err)
		}
		return nil
	}
	if err := untilReachable(ctx, retry, fails(&tries, down, down)); err != nil || tries != 3 || retries != 2 {
		t.Errorf("unavailable twice: err %v, %d tries, %d retries; want nil, 3, 2", err, tries, retries)
	}
	tries, retries = 0, 0
	if err := untilReachable(ctx, retry, fails(&tries, down, bad)); !errors.Is(err, bad) || tries != 2 || retries != 1 {
		t.Errorf("unavailable then bad: err %v, %d tries, %d retries; want bad, 2, 1", err, tries, retries)
	}
	tries = 0
	if err := untilReachable(ctx, nil, fails(&tries, down)); !errors.Is(err, down) || tries != 1 {
		t.Errorf("nil retry: err %v, %d tries; want down, 1", err, tries)
	}
	tries = 0
	giveUp := func(context.Context, error) error { return stop }
	if err := untilReachable(ctx, giveUp, fails(&tries, down)); !errors.Is(err, stop) || tries != 1 {
		t.Errorf("retry gives up: err %v, %d tries; want stop, 1", err, tries)
	}
	tries, retries = 0, 0
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := untilReachable(ended, retry, fails(&tries, down)); !errors.Is(err, down) || tries != 1 || retries != 0 {
		t.Errorf("ended ctx: err %v, %d tries, %d retries; want down, 1, 0", err, tries, retries)
	}
}
