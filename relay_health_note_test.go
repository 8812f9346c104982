package outbox

import (
	"errors"
	"testing"
	"time"
)

// TestHealthRecorderNote: a spell of not being ready keeps its start until
// the relay is ready again; the last error outlives it; the per-minute
// counts are the totals' increments, in the minute they were seen, for the
// last hour only.
func TestHealthRecorderNote(t *testing.T) {
	t.Parallel()
	h := &healthRecorder{}
	t0 := time.Date(2026, 12, 6, 10, 0, 30, 0, time.UTC)
	if start := h.note(t0.Add(-20*time.Second), errNotStarted, 0, 0); start.Ready || start.Reason == "" || start.LastError != "" {
		t.Fatalf("starting: %+v; want not ready, with no last error", start)
	}
	h = &healthRecorder{}
	down := errors.New("destination unavailable (2 looks in a row): dial tcp nats://u:secret-pass@broker:4222")
	first := h.note(t0, down, 0, 3)
	if first.Ready || first.NotReadySince == nil || !first.NotReadySince.Equal(t0) || first.Reason == "" {
		t.Fatalf("first note: %+v", first)
	}
	second := h.note(t0.Add(20*time.Second), down, 0, 5)
	if !second.NotReadySince.Equal(t0) {
		t.Fatalf("the spell's start moved to %v", second.NotReadySince)
	}
	up := h.note(t0.Add(40*time.Second), nil, 7, 5)
	if !up.Ready || up.NotReadySince != nil || up.Reason != "" || up.LastError != second.Reason || !up.LastErrorAt.Equal(t0.Add(20*time.Second)) {
		t.Fatalf("ready again: %+v", up)
	}
	if len(up.Minutes) != 2 || up.Minutes[0].Failed != 5 || up.Minutes[0].Published != 0 || up.Minutes[1].Published != 7 || up.Minutes[1].Failed != 0 {
		t.Fatalf("minutes: %+v; want 5 failed in 10:00, 7 published in 10:01", up.Minutes)
	}
	late := h.note(t0.Add(61*time.Minute), nil, 9, 5)
	if len(late.Minutes) != 2 || !late.Minutes[0].Minute.Equal(time.Date(2026, 12, 6, 10, 1, 0, 0, time.UTC)) || late.Minutes[1].Published != 2 {
		t.Fatalf("an hour later: %+v; want 10:01 kept and 2 published in 11:01", late.Minutes)
	}
}
