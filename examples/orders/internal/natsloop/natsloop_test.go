package natsloop

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
)

// Issue 22, item 6: an event failing at every delivery logs a warning at
// deliveries 1, 2, 4, 8, ... only (about log2 of the deliveries), and an
// early event none.
func TestFailureLevelThrottlesWarnings(t *testing.T) {
	failed := errors.New("the provider is down")
	warns := 0
	for d := 1; d <= 360; d++ {
		if FailureLevel(failed, d) == slog.LevelWarn {
			warns++
		}
		if l := FailureLevel(fmt.Errorf("order 7: %w", ErrEarly), d); l != slog.LevelDebug {
			t.Fatalf("an early event's delivery %d logs at %s, want debug", d, l)
		}
	}
	if warns != 9 { // 1, 2, 4, ..., 256
		t.Errorf("360 failed deliveries logged %d warnings, want 9", warns)
	}
}
