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
	// A full scan that took 10 s (most of it waiting for a lock, say): the
	// rest is 190 s by the duty, capped at 12 rescan intervals (60 s).
	c.fullDone(t0, 10*time.Second, 10, 1000)
	if k := c.nextKind(t0.Add(69*time.Second), rescan); k != claimFresh {
		t.Errorf("69 s after a 10 s full scan: %v, want the incremental claim", k)
	}
	if k := c.nextKind(t0.Add(70*time.Second+time.Millisecond), rescan); k != claimFull {
		t.Errorf("70 s after a 10 s full scan: %v, want the full scan (the rest capped at 12 rescan intervals)", k)
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
		if !complete && from.avail != mark.avail {
			t.Errorf("%s after a 10 s complete look: from %v, want the low-water mark", tc.after, from)
		}
	}
	// A complete look of an hour (a lock wait, say) asks for 100 hours:
	// capped at completeLookSpacingMax.
	c.lookDone(mark, true, t0, time.Hour)
	if _, complete := c.lookFrom(t0.Add(completeLookSpacingMax-time.Second), every); complete {
		t.Error("complete look due before completeLookSpacingMax after a one-hour one")
	}
	if _, complete := c.lookFrom(t0.Add(completeLookSpacingMax), every); !complete {
		t.Error("complete look not due completeLookSpacingMax after a one-hour one")
	}
	c.lookDone(mark, true, t0, 10*time.Second)
	// A look from the mark does not move the complete look's clock.
	c.lookDone(mark, false, t0.Add(500*time.Second), time.Second)
	if _, complete := c.lookFrom(t0.Add(1000*time.Second), every); !complete {
		t.Error("a look from the mark delayed the complete look")
	}
}

// TestFailedCompleteLookLetsTheLooksFromTheMarkRun: a complete look that
// fails (a statement_timeout shorter than a walk of the whole index) counts
// as done for its spacing, and sets a mark when there was none, so that the
// next looks read from a mark instead of failing the same way
// (TestAdv24FailingCompleteLookStopsEveryLook).
func TestFailedCompleteLookLetsTheLooksFromTheMarkRun(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	var c claimCursor
	from, complete := c.lookFrom(t0, 5*time.Minute)
	if !complete || from.avail.InfinityModifier != pgtype.NegativeInfinity {
		t.Fatalf("first look: %v from %v, want complete from the start", complete, from.avail)
	}
	c.lookFailed(true, t0, 300*time.Millisecond, 10*time.Second)
	from, complete = c.lookFrom(t0.Add(time.Second), 5*time.Minute)
	if complete || !from.avail.Time.Equal(t0.Add(-10*time.Second)) {
		t.Fatalf("after a failed complete look: complete %v from %v, want a look from the margin before it (%v)", complete, from.avail.Time, t0.Add(-10*time.Second))
	}
	if _, complete := c.lookFrom(t0.Add(5*time.Minute), 5*time.Minute); !complete {
		t.Error("the complete look not tried again after its spacing")
	}
}
