package outbox

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
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

// TestCompleteLookDutyBound: a complete look comes every completeEvery, or
// later when the last one was expensive (completeLookDuty): under a pinned
// xmin a complete look walks every dead entry (19 s after six minutes in the
// pressure bench), and one every five minutes was a core's tenth spent on
// the backstop.
func TestCompleteLookDutyBound(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	every := 5 * time.Minute
	var c claimCursor
	if _, complete := c.lookFrom(t0, every); !complete {
		t.Fatal("first look: not complete, want complete (no low-water mark yet)")
	}
	mark := lowMark{avail: pgtype.Timestamptz{Time: t0, Valid: true}, occ: pgtype.Timestamptz{Time: t0, Valid: true}}
	c.lookDone(mark, true, t0, 100*time.Millisecond) // cheap: 100 ms asks for 10 s, less than every
	for _, tc := range []struct {
		after time.Duration
		want  bool
	}{{time.Minute, false}, {every - time.Millisecond, false}, {every, true}} {
		if _, complete := c.lookFrom(t0.Add(tc.after), every); complete != tc.want {
			t.Errorf("%s after a cheap complete look: complete %v, want %v", tc.after, complete, tc.want)
		}
	}
	c.lookDone(mark, true, t0, 10*time.Second) // expensive: 10 s asks for 1,000 s
	for _, tc := range []struct {
		after time.Duration
		want  bool
	}{{every, false}, {999 * time.Second, false}, {1000 * time.Second, true}} {
		from, complete := c.lookFrom(t0.Add(tc.after), every)
		if complete != tc.want {
			t.Errorf("%s after a 10 s complete look: complete %v, want %v", tc.after, complete, tc.want)
		}
		if !complete && from != mark {
			t.Errorf("%s after a 10 s complete look: from %v, want the low-water mark", tc.after, from)
		}
	}
	// A look from the mark does not move the complete look's clock.
	c.lookDone(mark, false, t0.Add(500*time.Second), time.Second)
	if _, complete := c.lookFrom(t0.Add(1000*time.Second), every); !complete {
		t.Error("a look from the mark delayed the complete look")
	}
}
