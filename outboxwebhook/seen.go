package outboxwebhook

import (
	"container/heap"
	"context"
	"sync"
)

// RememberDefault is how many handled deliveries a Receiver remembers at
// most (about 150 bytes each).
const RememberDefault = 65536

// seenSet remembers the delivery ids (webhook-ids) a Receiver handled, each
// until its request's timestamp leaves the tolerance (after which the
// signature check refuses a copy anyway), at most max of them; and the ids
// in flight, so that two copies of one delivery are not handled at once.
type seenSet struct {
	mu       sync.Mutex
	max      int
	byID     map[string]*seenEntry
	byExpiry seenHeap
	inflight map[string]chan struct{}
	evicted  int64
}

type seenEntry struct {
	id     string
	expiry int64 // Unix seconds: the request's timestamp plus the tolerance
	index  int   // in byExpiry
}

func newSeenSet(max int) *seenSet {
	return &seenSet{max: max, byID: map[string]*seenEntry{}, inflight: map[string]chan struct{}{}}
}

// begin claims delivery id for handling at time now (Unix seconds). It
// returns handled=true when the delivery was handled already (then it
// remembers it at least until expiry); otherwise the caller holds the id
// and must call end. A concurrent copy waits for the one in flight to
// end, or for ctx.
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
// expiry, evicting the entry that expires first when the set is full.
func (s *seenSet) end(id string, ok bool, expiry int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.inflight[id])
	delete(s.inflight, id)
	if !ok || s.max <= 0 {
		return
	}
	for len(s.byID) >= s.max {
		e := heap.Pop(&s.byExpiry).(*seenEntry)
		delete(s.byID, e.id)
		s.evicted++
	}
	e := &seenEntry{id: id, expiry: expiry}
	s.byID[id] = e
	heap.Push(&s.byExpiry, e)
}

// purge forgets the deliveries whose timestamps are out of tolerance.
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
