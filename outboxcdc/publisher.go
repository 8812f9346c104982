package outboxcdc

// The publisher: the goroutine beside the reader that hands the queued ids
// to Relay.PublishIDs, keeps those it could not publish yet (the waiting
// set) and hands them over again, finishes the rest, and waits for the
// background marks before the slot may be confirmed past them.

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/pgident"
)

// missingFor is how long an id PublishIDs does not find is retried before
// it is left to the polling path, when its transaction was read again
// (after a restart or a rewind): an id missing for longer was deleted
// (clean-up). An id of a transaction the stream read live (txn.live) is
// kept for WaitLimit instead: PostgreSQL sends a commit to the stream a
// moment before the transaction is visible to other sessions, and with
// synchronous replication (synchronous_standby_names) as long as the
// standby takes to confirm it, which a slow standby can stretch past any
// fixed second.
const missingFor = time.Second

// missingLimit is how long the id p is kept while the table does not show
// it (see missingFor).
func (p *publisher) missingLimit(id pendingID) time.Duration {
	if id.tx != nil && id.tx.live {
		return max(p.cfg.WaitLimit, missingFor)
	}
	return missingFor
}

// waitRetryMin and waitRetryMax bound the pause before an id waiting for
// its lane is handed over again on its own (it also rides along with any
// call that carries an event of its aggregate): doubling from the first to
// the second.
const (
	waitRetryMin = 10 * time.Millisecond
	waitRetryMax = 100 * time.Millisecond
)

// confirmInterval is how often, at most, the publisher waits for the marks
// being written in the background (Relay.WaitPublishIDs) so that the slot
// may be confirmed past them, and how often the reader confirms.
const confirmInterval = 100 * time.Millisecond

// waitEntry is an id the publisher keeps and hands over again.
type waitEntry struct {
	p       pendingID
	since   time.Time // when a call first did not publish it
	next    time.Time // when it is handed over again on its own
	tries   int
	missing bool // the table had no row for it at the last call
}

// publisher is the stream's publishing goroutine. Only it calls PublishIDs
// and WaitPublishIDs, and only it touches waiting.
type publisher struct {
	cfg   Config
	log   *slog.Logger
	st    *Stats
	f     *feed
	state string // stateSQL for the schema

	waiting   []*waitEntry
	nextMarks time.Time
}

func newPublisher(cfg Config, log *slog.Logger, st *Stats, f *feed) (*publisher, error) {
	s, err := pgident.NewSchema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	return &publisher{cfg: cfg, log: log, st: st, f: f, state: stateSQL(s.Table("outbox_events"))}, nil
}

// item is an id of a batch, with its waiting entry when it waited.
type item struct {
	p pendingID
	w *waitEntry
}

// run publishes until ctx ends (nil) or a failpoint fails it.
func (p *publisher) run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	defer p.st.waiting.Store(0)
	for {
		if ctx.Err() != nil {
			return nil
		}
		now := time.Now()
		if due, handed, events := p.f.marksDue(); due && !now.Before(p.nextMarks) {
			p.waitMarks(ctx, handed, events)
			continue
		}
		batch, next := p.take(now)
		if len(batch) > 0 {
			if err := p.publish(ctx, batch); err != nil {
				return err
			}
			continue
		}
		if due, _, _ := p.f.marksDue(); due && p.nextMarks.Before(next) {
			next = p.nextMarks
		}
		timer.Reset(max(time.Until(next), 0))
		select {
		case <-ctx.Done():
			return nil
		case <-p.f.wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// take returns the next batch when one is due, else when to look again: the
// waiting ids due again, then the fresh ids (BatchSize in all), once a
// batch is full or the oldest fresh id waited FlushInterval; then the
// waiting ids of the aggregates in the batch, whose predecessor may be in
// it (up to BatchSize more).
func (p *publisher) take(now time.Time) ([]item, time.Time) {
	next := now.Add(time.Hour)
	var batch []item
	kept := p.waiting[:0]
	for _, w := range p.waiting {
		if len(batch) < p.cfg.BatchSize && !now.Before(w.next) {
			batch = append(batch, item{p: w.p, w: w})
			continue
		}
		kept = append(kept, w)
		if w.next.Before(next) {
			next = w.next
		}
	}
	clear(p.waiting[len(kept):])
	p.waiting = kept

	f := p.f
	f.mu.Lock()
	n := len(f.fresh)
	freshDue := n >= p.cfg.BatchSize || n > 0 && !now.Before(f.freshSince.Add(p.cfg.FlushInterval))
	if n > 0 && !freshDue {
		if d := f.freshSince.Add(p.cfg.FlushInterval); d.Before(next) {
			next = d
		}
	}
	if freshDue || len(batch) > 0 {
		k := min(n, p.cfg.BatchSize-len(batch))
		for _, fp := range f.fresh[:k] {
			batch = append(batch, item{p: fp})
		}
		clear(f.fresh[:k])
		f.fresh = f.fresh[k:]
		if len(f.fresh) == 0 {
			f.fresh = nil
		}
	}
	f.mu.Unlock()

	if len(batch) > 0 && len(p.waiting) > 0 {
		lanes := make(map[string]bool, len(batch))
		for _, it := range batch {
			if it.p.lane != "" {
				lanes[it.p.lane] = true
			}
		}
		extra := 0
		kept := p.waiting[:0]
		for _, w := range p.waiting {
			if extra < p.cfg.BatchSize && lanes[w.p.lane] {
				batch = append(batch, item{p: w.p, w: w})
				extra++
				continue
			}
			kept = append(kept, w)
		}
		clear(p.waiting[len(kept):])
		p.waiting = kept
	}
	p.st.waiting.Store(int64(len(p.waiting)))
	return batch, next
}

// publish hands a batch to PublishIDs: on a database error or an outage it
// waits and calls again with the same ids. Then it sorts the ids out:
// published by the call (PublishIDsResult.PublishedIDs), found published,
// missing (kept for up to missingFor), waiting for their lane (kept for up
// to WaitLimit), or left to the table (parked behind a quarantine, or past
// their limit); and finishes all but the kept ones.
func (p *publisher) publish(ctx context.Context, batch []item) error {
	ids := make([]uuid.UUID, len(batch))
	for i, it := range batch {
		ids[i] = it.p.id
	}
	var res outbox.PublishIDsResult
	for failures := 1; ; failures++ {
		if err := failpoint.Hit("cdc/before-publish"); err != nil {
			return err
		}
		var err error
		res, err = p.cfg.Relay.PublishIDs(ctx, ids)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			d := jitter(failures, p.cfg.RetryMin, p.cfg.RetryMax)
			p.log.Warn("cdc publish failed; retrying the same events", slog.Int("events", len(ids)), slog.Any("error", err), slog.Duration("retry_in", d))
			if !sleepCtx(ctx, d) {
				return nil
			}
			continue
		}
		if !res.Unavailable {
			break
		}
		p.st.outages.Add(1)
		p.log.Warn("destination unavailable; keeping the slot's position and retrying the same events",
			slog.Int("events", len(ids)), slog.Duration("retry_in", res.RetryIn))
		if !sleepCtx(ctx, res.RetryIn) {
			return nil
		}
	}
	p.st.published.Add(int64(res.Published))

	published := make(map[uuid.UUID]bool, len(res.PublishedIDs))
	for _, id := range res.PublishedIDs {
		published[id] = true
	}
	missing := make(map[uuid.UUID]bool, len(res.Missing))
	for _, id := range res.Missing {
		missing[id] = true
	}
	// The events found and not published by this call: which, and why, only
	// the table says.
	var found []uuid.UUID
	for _, id := range ids {
		if !missing[id] && !published[id] {
			found = append(found, id)
		}
	}
	var states map[uuid.UUID]idState
	if len(found) > 0 {
		var err error
		for failures := 1; ; failures++ {
			if states, err = p.states(ctx, found); err == nil {
				break
			}
			if ctx.Err() != nil {
				return nil
			}
			d := jitter(failures, p.cfg.RetryMin, p.cfg.RetryMax)
			p.log.Warn("cdc: reading the state of events not published failed; retrying", slog.Int("events", len(found)), slog.Any("error", err), slog.Duration("retry_in", d))
			if !sleepCtx(ctx, d) {
				return nil
			}
		}
	}

	now := time.Now()
	var done []pendingID
	doneFound, gaveUpMissing, gaveUpWaiting, parked := 0, 0, 0, 0
	for _, it := range batch {
		w := it.w
		if w == nil {
			w = &waitEntry{p: it.p}
		}
		switch {
		case published[it.p.id]:
			doneFound++
		case missing[it.p.id]:
			if !w.missing || w.since.IsZero() {
				w.since, w.tries = now, 0
			}
			w.missing = true
			if now.Sub(w.since) < p.missingLimit(it.p) {
				w.next = now.Add(max(p.cfg.FlushInterval, time.Millisecond))
				p.waiting = append(p.waiting, w)
				continue
			}
			gaveUpMissing++
		default:
			s := states[it.p.id]
			switch s.kind {
			case stateDone:
				doneFound++
			case stateParked:
				parked++
			default: // statePending
				if w.since.IsZero() || w.missing {
					w.since, w.missing, w.tries = now, false, 0
				}
				if now.Sub(w.since) < p.cfg.WaitLimit {
					w.tries++
					w.next = now.Add(max(backoff.Exponential(w.tries, waitRetryMin, waitRetryMax), s.dueIn))
					p.waiting = append(p.waiting, w)
					continue
				}
				gaveUpWaiting++
			}
		}
		done = append(done, it.p)
	}
	if d := doneFound - res.Published; d > 0 {
		p.st.alreadyPublished.Add(int64(d))
	}
	if left := gaveUpMissing + gaveUpWaiting + parked; left > 0 {
		p.st.left.Add(int64(left))
	}
	if gaveUpMissing > 0 {
		p.log.Warn("events read from the WAL are not in the table; leaving them to the polling path", slog.Int("events", gaveUpMissing))
	}
	if gaveUpWaiting > 0 {
		p.log.Warn("events still blocked (an earlier event of their aggregate unpublished, leased by another relay, or backing off) after the wait limit; leaving them to the safety net",
			slog.Int("events", gaveUpWaiting), slog.Duration("wait_limit", p.cfg.WaitLimit))
	}
	p.st.waiting.Store(int64(len(p.waiting)))
	p.f.finish(done)
	p.st.queued.Store(int64(p.f.heldCount()))
	return nil
}

// waitMarks waits for the background marks of the calls made so far, then
// records handed (read before the wait) as marked: the reader may confirm
// the slot up to it.
func (p *publisher) waitMarks(ctx context.Context, handed, events pglogrepl.LSN) {
	if err := p.cfg.Relay.WaitPublishIDs(ctx); err != nil {
		if ctx.Err() != nil {
			return
		}
		// The events stay leased, unmarked; the safety net publishes them
		// again once the lease expired (at least once). Reading them again
		// would find them leased all the same.
		p.log.Warn("marking events published failed; the safety net publishes them again when their lease expires", slog.Any("error", err))
	}
	p.f.setMarked(handed, events)
	p.nextMarks = time.Now().Add(confirmInterval)
}

// sleepCtx sleeps d or until ctx ends, and reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
