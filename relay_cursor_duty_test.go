package outbox

import (
	"testing"
	"time"
)

// TestFullScanDutyBound: a full scan that took d is not run again before
// 19·d has passed since it ended, whether RescanInterval passed or the scan
// filled its batch (which otherwise asks for another at once); a cheap one
// is not held back.
func TestFullScanDutyBound(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	rescan := 5 * time.Second
	var c claimCursor
	if k := c.nextKind(t0, rescan); k != claimFull {
		t.Fatalf("first claim: %v, want the full scan", k)
	}
	// An expensive full scan (2 s) that filled its batch.
	c.fullDone(t0, 2*time.Second, 1000, 1000)
	for _, tc := range []struct {
		after time.Duration
		want  claimKind
	}{
		{2*time.Second + time.Millisecond, claimFresh}, // a full batch, but 2 s of scanning asks for 38 s of rest
		{10 * time.Second, claimFresh},                 // RescanInterval passed: still resting
		{39 * time.Second, claimFresh},
		{40*time.Second + time.Millisecond, claimFull}, // 2 s + 38 s
	} {
		if k := c.nextKind(t0.Add(tc.after), rescan); k != tc.want {
			t.Errorf("%s after an expensive full scan: %v, want %v", tc.after, k, tc.want)
		}
	}
	// A cheap one (3 ms) that filled its batch: another at once (57 ms of rest).
	c.fullDone(t0, 3*time.Millisecond, 1000, 1000)
	if k := c.nextKind(t0.Add(100*time.Millisecond), rescan); k != claimFull {
		t.Errorf("after a cheap full scan that filled its batch: %v, want the full scan again", k)
	}
	// A cheap one with room left: the next full scan after RescanInterval.
	c.fullDone(t0, 3*time.Millisecond, 10, 1000)
	if k := c.nextKind(t0.Add(time.Second), rescan); k != claimFresh {
		t.Errorf("1 s after a cheap full scan: %v, want the incremental claim", k)
	}
	if k := c.nextKind(t0.Add(rescan), rescan); k != claimFull {
		t.Errorf("RescanInterval after a cheap full scan: %v, want the full scan", k)
	}
}
