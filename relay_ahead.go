package outbox

import (
	"context"
	"log/slog"
	"time"
)

// ahead is a claim started while the previous batch is being published.
type ahead struct {
	done chan struct{}
	b    batch
	dur  time.Duration
	err  error
}

// claimAhead starts claiming the next batch while b is published and
// settled, so that the claim's round trip overlaps the broker's acks and the
// marks: a relay draining a backlog then keeps the database, the broker and
// itself busy at once, instead of in turn. It does so only after a full
// batch over many lanes (a backlog, where the next batch is there to take):
// a batch of few lanes holds them, and the next claim would only find their
// later events blocked behind it.
//
// Order is kept: the next claim cannot take any event of b's lanes. b's
// events are leased, so not claimable; their successors are not heads while
// b's events are unpublished, and a successor is only ever claimed with its
// head. So the two batches hold disjoint lanes.
func (r *Relay) claimAhead(ctx context.Context, b batch) {
	if r.cfg.DisableClaimAhead || b.total < r.cfg.BatchSize || len(b.lanes) < b.total/2 {
		return
	}
	if r.fullScanReady() {
		// The full scan's batch is next: a batch claimed ahead would come
		// first again, and in a backlog (every batch full) the full scan's
		// would wait past its lease (TestFullScanBatchTakenDuringBacklog).
		return
	}
	a := &ahead{done: make(chan struct{})}
	r.ahead = a
	go func() {
		defer close(a.done)
		start := time.Now()
		// Not cancelled with ctx: a claim that completes can be released.
		a.b, a.err = r.claim(context.WithoutCancel(ctx))
		a.dur = time.Since(start)
	}()
}

// nextClaim returns the batch claimed ahead, if any, or the batch of a
// finished background full scan, or claims one now; how long the claim took;
// and whether it was a background full scan. A full scan that found nothing
// is observed here, and a claim made.
func (r *Relay) nextClaim(ctx context.Context) (b batch, d time.Duration, full bool, err error) {
	if a := r.ahead; a != nil {
		r.ahead = nil
		<-a.done
		return a.b, a.dur, false, a.err
	}
	if a, ok := r.takeFullScan(); ok {
		if a.err != nil || a.b.total > 0 {
			return a.b, a.dur, true, a.err
		}
		r.observeClaim(a.b, a.dur, nil, true)
	}
	start := time.Now()
	b, err = r.claim(ctx)
	return b, time.Since(start), false, err
}

// dropAhead releases a batch claimed ahead that will not be published (the
// relay stops, or the previous batch met an outage or an error).
func (r *Relay) dropAhead(ctx context.Context) {
	a := r.ahead
	if a == nil {
		return
	}
	r.ahead = nil
	<-a.done
	if a.err != nil || a.b.total == 0 {
		return
	}
	if err := r.release(context.WithoutCancel(ctx), a.b, allIDs(a.b)); err != nil {
		r.log.Warn("release the batch claimed ahead (its lease will expire)", slog.Any("error", err))
	}
}
