// Package backoff computes the waits between retries: a delay that doubles
// with each consecutive failure up to a cap, with or without jitter. The
// relay, the CDC stream, the side-effect reconciler, the CLI's start-up wait
// and the example's consumers share it.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Exponential is min doubled for each failure after the first (n >= 1),
// capped at max.
func Exponential(n int, min, max time.Duration) time.Duration {
	d := min
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d
}

// Jittered is Exponential with "equal jitter": a random delay between half
// of it and all of it, so that processes failing together do not retry in
// step. It is 0 when Exponential is 0 or less.
func Jittered(n int, min, max time.Duration) time.Duration {
	d := Exponential(n, min, max)
	if d <= 0 {
		return 0
	}
	half := d / 2
	return half + rand.N(d-half+1)
}
