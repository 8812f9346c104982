package outboxwebhook

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestSeenSetBounded: the memory forgets a delivery once its timestamp is
// out of tolerance, holds at most its bound (forgetting the one that
// expires first, and refusing from then on what is no newer than it),
// extends an entry a later copy renews, and makes a copy wait while the
// first is in flight.
func TestSeenSetBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSeenSet(3)
	handle := func(id string, now, expiry int64, ok bool) bool {
		t.Helper()
		handled, err := s.begin(ctx, id, now, expiry)
		if err != nil {
			t.Fatal(err)
		}
		if !handled {
			s.end(id, ok, expiry)
		}
		return handled
	}
	if handle("a", 0, 100, true) || !handle("a", 50, 100, true) {
		t.Fatal("a handled delivery is not remembered")
	}
	if handle("f", 0, 100, false) || handle("f", 0, 100, false) {
		t.Fatal("a failed delivery is remembered")
	}
	if handle("a", 101, 400, true) {
		t.Fatal("a delivery is remembered past its expiry")
	}
	for i := range 10 {
		handle(fmt.Sprint("b", i), 200, int64(300+i), true)
	}
	if n, evicted := s.size(); n != 3 || evicted != 8 {
		t.Fatalf("%d remembered, %d forgotten early; want 3 and 8", n, evicted)
	}
	if !handle("b9", 200, 600, true) {
		t.Fatal("the memory kept the wrong entries when full")
	}
	// b0 was forgotten while still acceptable: a copy of it, or of anything
	// no newer, is refused rather than handled again; newer ones are not.
	for _, id := range []string{"b0", "b7", "new-but-old-timestamp"} {
		if _, err := s.begin(ctx, id, 200, 307); !errors.Is(err, errForgotten) {
			t.Fatalf("%s, no newer than a delivery forgotten early: %v, want errForgotten", id, err)
		}
	}
	if handle("b10", 200, 310, true) {
		t.Fatal("a delivery newer than the ones forgotten is taken for handled")
	}

	// A copy in flight.
	if handled, _ := s.begin(ctx, "c", 200, 500); handled {
		t.Fatal("c is not handled yet")
	}
	got := make(chan bool)
	go func() {
		handled, _ := s.begin(ctx, "c", 200, 500)
		got <- handled
	}()
	select {
	case <-got:
		t.Fatal("a copy did not wait for the one in flight")
	default:
	}
	s.end("c", true, 500)
	if !<-got {
		t.Fatal("the copy did not see the first one handled")
	}
	cctx, cancel := context.WithCancel(ctx)
	if handled, _ := s.begin(ctx, "d", 200, 500); handled {
		t.Fatal("d is not handled yet")
	}
	cancel()
	if _, err := s.begin(cctx, "d", 200, 500); err == nil {
		t.Fatal("a copy waited past its context")
	}
}
