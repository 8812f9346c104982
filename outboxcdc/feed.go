package outboxcdc

// The feed: what the stream's reader and its publisher share. The reader
// appends the committed transactions it decodes and queues their ids; the
// publisher hands the ids to Relay.PublishIDs, finishes them, and records
// how far the marks are written; the reader confirms the slot from that.
// Neither ever waits for the other: the reader only takes the lock.

import (
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
)

// txn is a complete transaction of the stream.
type txn struct {
	end    pglogrepl.LSN // its end LSN (that of later transactions without ids, merged into it)
	open   int           // its ids not finished yet
	hasIDs bool          // it inserted events
	// live: the stream read its commit as it happened (its commit time
	// within liveCommit of reading it), not again after a restart or a
	// rewind. An id of a live commit that the table does not show yet is
	// a commit not yet visible, not a deleted event (missingFor).
	live bool
}

// liveCommit is how far behind its commit time the stream may read a
// transaction for it to count as read live (txn.live); it allows for the
// clocks of the relay's host and the server to differ a little.
const liveCommit = 5 * time.Second

// pendingID is an id read from the WAL, with its aggregate's lane and its
// transaction.
type pendingID struct {
	id   uuid.UUID
	lane string // aggregate_type and aggregate_id; "" when not decoded
	tx   *txn
}

// feed is the state shared by the reader and the publisher, under mu.
type feed struct {
	mu sync.Mutex
	// txns are the complete transactions read and not yet finished, in
	// commit order: the slot is confirmed at most up to the end of the
	// last transaction before the first of them.
	txns []*txn
	// fresh are the ids queued and not yet taken by the publisher, in
	// commit order; freshSince is when the oldest of them was queued.
	fresh      []pendingID
	freshSince time.Time
	// held counts the ids read and not finished: queued, in a call, or
	// waiting (at most maxQueued, unless one transaction alone has more).
	held, maxQueued int
	// deferring: a transaction's ids were not queued because held reached
	// maxQueued. No later transaction is queued or confirmed in this
	// session; once everything before it is finished and confirmed the
	// reader ends the session and the stream reads them again.
	deferring bool
	// handed is the end of the last transaction of the unbroken run of
	// finished transactions (or a keepalive's WAL end when nothing was
	// open); lastEvents is the end of the last finished transaction that
	// had ids. marked is a value of handed taken before the publisher
	// waited for the marks of every call made until then (markedEvents:
	// lastEvents at that moment): everything up to marked is published and
	// marked, or left to the table.
	handed, lastEvents, marked, markedEvents pglogrepl.LSN
	// wake tells the publisher that ids were queued.
	wake chan struct{}
}

func newFeed(start pglogrepl.LSN, maxQueued int) *feed {
	return &feed{handed: start, marked: start, maxQueued: maxQueued, wake: make(chan struct{}, 1)}
}

// commit records a committed transaction ending at end with ids (they get
// their transaction set), and reports whether its ids were queued (false:
// deferred, see deferring).
func (f *feed) commit(end pglogrepl.LSN, ids []pendingID, now, committed time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.deferring {
		return len(ids) == 0
	}
	if len(ids) == 0 {
		// Nothing to finish: it is confirmed with the transaction before it.
		if n := len(f.txns); n > 0 {
			f.txns[n-1].end = end
		} else {
			f.handed = max(f.handed, end)
		}
		return true
	}
	if f.held > 0 && f.held+len(ids) > f.maxQueued {
		f.deferring = true
		return false
	}
	t := &txn{end: end, open: len(ids), hasIDs: true, live: now.Sub(committed) < liveCommit}
	f.txns = append(f.txns, t)
	if len(f.fresh) == 0 {
		f.freshSince = now
	}
	for _, p := range ids {
		p.tx = t
		f.fresh = append(f.fresh, p)
	}
	f.held += len(ids)
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return true
}

// keepalive moves handed to a keepalive's WAL end when no transaction is
// open or unfinished: everything the server decoded up to there was
// received and finished, so the slot stops holding WAL of other tables.
// The caller has no transaction open.
func (f *feed) keepalive(walEnd pglogrepl.LSN) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.deferring && len(f.txns) == 0 {
		f.handed = max(f.handed, walEnd)
	}
}

// finish records ids as finished (published, found published, or left to
// the table) and moves handed past the transactions now finished.
func (f *feed) finish(ids []pendingID) {
	if len(ids) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range ids {
		p.tx.open--
	}
	f.held -= len(ids)
	for len(f.txns) > 0 && f.txns[0].open == 0 {
		t := f.txns[0]
		f.handed = max(f.handed, t.end)
		if t.hasIDs {
			f.lastEvents = max(f.lastEvents, t.end)
		}
		f.txns[0] = nil
		f.txns = f.txns[1:]
	}
	if len(f.txns) == 0 {
		f.txns = nil
	}
}

// confirmable is the position the slot may be confirmed at: handed when
// the marks of every event up to it were waited for, else marked. events
// is the end of the last transaction with ids at or before it.
func (f *feed) confirmable() (lsn, events pglogrepl.LSN) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lastEvents <= f.marked {
		return f.handed, f.lastEvents
	}
	return f.marked, f.markedEvents
}

// outstanding reports whether anything read is not finished and
// confirmable yet, and whether the session should end to read deferred
// transactions again (everything before them finished and marked).
func (f *feed) outstanding() (busy, rewind bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	idle := len(f.txns) == 0 && f.held == 0 && f.lastEvents <= f.marked
	return !idle, f.deferring && idle
}

// marksDue reports whether finished events wait for their marks to be
// waited for, and returns the position and events to record then.
func (f *feed) marksDue() (due bool, handed, events pglogrepl.LSN) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastEvents > f.marked, f.handed, f.lastEvents
}

// setMarked records that the marks of every event up to handed are written.
func (f *feed) setMarked(handed, events pglogrepl.LSN) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if handed > f.marked {
		f.marked, f.markedEvents = handed, events
	}
}

// heldCount is the number of ids held.
func (f *feed) heldCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held
}
