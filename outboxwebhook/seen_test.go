package outboxwebhook

import (
	"context"
	"fmt"
	"testing"
)

// TestSeenSetBounded: the memory forgets a delivery once its timestamp is
// out of tolerance, holds at most its bound (forgetting the one that
// expires first), extends an entry a later copy renews, and makes a copy
// wait while the first is in flight.
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
	if !handle("b9", 200, 600, true) || handle("b0", 200, 300, true) {
		t.Fatal("the memory kept the wrong entries when full")
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
