package inbox_test

import (
	"testing"
	"time"

	"github.com/pgoutbox/outbox/inbox"
)

// Issue 22, item 6: the exported redelivery delay stays within its
// documented bounds, starts at Min, grows with the deliveries and is capped.
func TestRedeliveryDelayBounds(t *testing.T) {
	if got := inbox.RedeliveryDelay(1); got != inbox.RedeliveryDelayMin {
		t.Errorf("RedeliveryDelay(1) = %s, want %s", got, inbox.RedeliveryDelayMin)
	}
	if got := inbox.RedeliveryDelay(0); got != inbox.RedeliveryDelayMin {
		t.Errorf("RedeliveryDelay(0) = %s, want %s", got, inbox.RedeliveryDelayMin)
	}
	for n := 1; n <= 64; n++ {
		// Without jitter: 100ms × 2^(n-1), capped at 10s.
		want := min(inbox.RedeliveryDelayMin<<min(n-1, 20), inbox.RedeliveryDelayMax)
		for range 100 {
			got := inbox.RedeliveryDelay(n)
			if got < max(want/2, inbox.RedeliveryDelayMin) || got > want {
				t.Fatalf("RedeliveryDelay(%d) = %s, outside [%s, %s]", n, got, max(want/2, inbox.RedeliveryDelayMin), want)
			}
		}
	}
	// Capped: far deliveries stay between half the cap and the cap.
	for range 100 {
		if got := inbox.RedeliveryDelay(1 << 20); got < inbox.RedeliveryDelayMax/2 || got > inbox.RedeliveryDelayMax {
			t.Fatalf("RedeliveryDelay(2^20) = %s, want within [%s, %s]", got, inbox.RedeliveryDelayMax/2, inbox.RedeliveryDelayMax)
		}
	}
}

func TestBackoffMinMax(t *testing.T) {
	b := inbox.Backoff{Min: 20 * time.Millisecond, Max: 50 * time.Millisecond}
	if got := b.Delay(1); got != 20*time.Millisecond {
		t.Errorf("Delay(1) = %s, want 20ms", got)
	}
	for n := 1; n < 40; n++ {
		for range 50 {
			if got := b.Delay(n); got < b.Min || got > b.Max {
				t.Fatalf("Delay(%d) = %s, outside [%s, %s]", n, got, b.Min, b.Max)
			}
		}
	}
	// Max below Min is Min.
	if got := (inbox.Backoff{Min: time.Second, Max: time.Millisecond}).Delay(9); got != time.Second {
		t.Errorf("Max below Min: Delay = %s, want 1s", got)
	}
	// Only Min set: the default cap applies.
	if got := (inbox.Backoff{Min: time.Second}).Delay(30); got > inbox.RedeliveryDelayMax || got < inbox.RedeliveryDelayMax/2 {
		t.Errorf("Min only: Delay(30) = %s, want within [5s, 10s]", got)
	}
}
