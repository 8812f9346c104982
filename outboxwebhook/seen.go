package outboxwebhook

import (
	"container/heap"
	"context"
	"errors"
	"sync"
)

// RememberDefault is how many handled deliveries a Receiver remembers at
// most (about 200 bytes each: some 13 MiB).
const RememberDefault = 65536

// errForgotten: a delivery whose timestamp is no later than that of one the
// memory had to forget while it was still within the tolerance; it may be
// a replay of that one, so it is refused (503: the relay sends it again,
// with a new timestamp).
var errForgotten = errors.New("the receiver's memory of handled deliveries is full, and this request is no newer than one it forgot: send it again with a new timestamp")

// seenSet remembers the delivery ids (webhook-ids) a Receiver handled, each
// until its request's timestamp leaves the tolerance (after which the
// signature check refuses a copy anyway), at most max of them; and the ids
// in flight, so that two copies of one delivery are not handled at once.
//
// When full it forgets the entry that expires first, and remembers that
// expiry as its floor: from then on it refuses (errForgotten) any delivery
// it does not remember whose expiry is not after the floor, since that may
// be a copy of the one forgotten. So a replay is never handled twice while
// it is acceptable, and memory stays bounded; the price, only when more
// than max deliveries arrive within the tolerance, is that a delivery
// delayed until its timestamp is older than the forgotten one's is sent
// again (the relay re-signs every attempt with a new timestamp).
type seenSet struct {
	mu       sync.Mutex
	max      int
	byID     map[string]*seenEntry
	byExpiry seenHeap
	inflight map[string]chan struct{}
	evicted  int64
	floor    int64 // the latest expiry forgotten early
}

type seenEntry struct {
	id     string
	expiry int64 // Unix seconds: the request's timestamp plus the tolerance
	index  int   // in byExpiry
}

func newSeenSet(max int) *seenSet {
	return &seenSet{max: max, byID: map[string]*seenEntry{}, inflight: map[string]chan struct{}{}}
}

// begin claims delivery id for handling at time now (Unix seconds, the
// same reading the request's timestamp was checked against). It returns
// handled=true when the delivery was handled already (then it remembers it
// at least until expiry); errForgotten when it may be a copy of a delivery
// forgotten early; otherwise the caller holds the id and must call end. A
// concurrent copy waits for the one in flight to end, or for ctx.
func (s *seenSet) begin(ctx context.Context, id string, now, expiry int64) (handled bool, err error) {
	for {
		s.mu.Lock()
		s.purge(now)
		if e, ok := s.byID[id]; ok {
			if expiry > e.expiry {
				e.expiry = expiry
				heap.Fix(&s.byExpiry, e.index)
			}
			s.mu.Unlock()
			return true, nil
		}
		wait, busy := s.inflight[id]
		if !busy && expiry <= s.floor {
			s.mu.Unlock()
			return false, errForgotten
		}
		if !busy {
			s.inflight[id] = make(chan struct{})
			s.mu.Unlock()
			return false, nil
		}
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// end releases id; when ok, the delivery is remembered as handled until
// expiry. When the set is then over its bound, the entry that expires
// first (maybe this one) is forgotten and its expiry becomes the floor.
func (s *seenSet) end(id string, ok bool, expiry int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.inflight[id])
	delete(s.inflight, id)
	if !ok || s.max <= 0 {
		return
	}
	e := &seenEntry{id: id, expiry: expiry}
	s.byID[id] = e
	heap.Push(&s.byExpiry, e)
	for len(s.byID) > s.max {
		e := heap.Pop(&s.byExpiry).(*seenEntry)
		delete(s.byID, e.id)
		s.evicted++
		s.floor = max(s.floor, e.expiry)
	}
}

// purge forgets the deliveries whose timestamps are out of tolerance at
// now: expiry < now, exactly when the timestamp check refuses them.
func (s *seenSet) purge(now int64) {
	for len(s.byExpiry) > 0 && s.byExpiry[0].expiry < now {
		e := heap.Pop(&s.byExpiry).(*seenEntry)
		delete(s.byID, e.id)
	}
}

// size returns how many deliveries are remembered, and how many were
// forgotten early because the set was full.
func (s *seenSet) size() (int, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID), s.evicted
}

// seenHeap orders entries by expiry (container/heap).
type seenHeap []*seenEntry

func (h seenHeap) Len() int           { return len(h) }
func (h seenHeap) Less(i, j int) bool { return h[i].expiry < h[j].expiry }
func (h seenHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *seenHeap) Push(x any) {
	e := x.(*seenEntry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *seenHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
