package main

import (
	"math"
	"testing"
	"time"
)

// TestRecoveredInIsTheFirstWindowBack checks the recovery rule on a made-up
// minute: 5 ms events at 100/s, slow (500 ms) for the first 12 s after the
// cell, and a burst of slow ones in the last 3 s (an autovacuum). The first
// 10 s window back starts at 12 s, and the burst does not undo it; a phase
// that never comes back reads -1.
func TestRecoveredInIsTheFirstWindowBack(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	end := start.Add(time.Minute)
	series := func(slow func(at time.Duration) bool) (lats []time.Duration, commits []int64) {
		for at := time.Duration(0); at < time.Minute; at += 10 * time.Millisecond {
			d := 5 * time.Millisecond
			if slow(at) {
				d = 500 * time.Millisecond
			}
			lats = append(lats, d)
			commits = append(commits, start.Add(at).UnixNano())
		}
		return lats, commits
	}
	lats, commits := series(func(at time.Duration) bool { return at < 12*time.Second || at >= 57*time.Second })
	in, after := recoveredIn(lats, commits, start, end, 10)
	if in != 12*time.Second {
		t.Errorf("recovered in %s, want 12s", in)
	}
	if after <= 10 {
		t.Errorf("p99 from then to the end %.1f ms: the last 3 s's burst should show in it", after)
	}
	lats, commits = series(func(at time.Duration) bool { return at%(5*time.Second) < time.Second })
	if in, after := recoveredIn(lats, commits, start, end, 10); in != -1 || !math.IsNaN(after) {
		t.Errorf("a phase slow every 5 s read recovered in %s (p99 after %.1f), want -1", in, after)
	}
}
