package backoff

import (
	"testing"
	"time"
)

func TestExponentialDoublesUpToTheCap(t *testing.T) {
	for _, c := range []struct {
		n    int
		want time.Duration
	}{{0, 100 * time.Millisecond}, {1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {4, 800 * time.Millisecond}, {5, time.Second}, {60, time.Second}} {
		if got := Exponential(c.n, 100*time.Millisecond, time.Second); got != c.want {
			t.Errorf("Exponential(%d) = %s, want %s", c.n, got, c.want)
		}
	}
}

func TestJitteredStaysBetweenHalfAndAll(t *testing.T) {
	for n := 1; n < 8; n++ {
		d := Exponential(n, 100*time.Millisecond, time.Second)
		for range 200 {
			if got := Jittered(n, 100*time.Millisecond, time.Second); got < d/2 || got > d {
				t.Fatalf("Jittered(%d) = %s, outside [%s, %s]", n, got, d/2, d)
			}
		}
	}
	if got := Jittered(3, 0, 0); got != 0 {
		t.Fatalf("Jittered with no delay = %s, want 0", got)
	}
}
