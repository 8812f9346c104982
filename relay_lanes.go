package outbox

// Lanes: one aggregate's claimed events, kept in sequence order.
// The argument: docs/design.md, "Claiming".

import (
	"slices"

	"github.com/google/uuid"
)

// orderLanes puts each lane's events in sequence order (the claim statement
// returns rows in no particular order) and cuts a lane at its first gap. The
// claim only ever returns a head and its contiguous successors, so a gap
// cannot happen; the cut is a second line of defence for invariant I5: the
// relay never publishes k+2 of an aggregate without k+1 before it. It returns
// the ids of the events cut off, which the caller releases.
func orderLanes(lanes [][]claimedEvent) (cut []uuid.UUID) {
	for i, lane := range lanes {
		if len(lane) < 2 {
			continue
		}
		slices.SortFunc(lane, func(a, b claimedEvent) int {
			switch {
			case a.Sequence < b.Sequence:
				return -1
			case a.Sequence > b.Sequence:
				return 1
			}
			return 0
		})
		for j := 1; j < len(lane); j++ {
			if lane[j].Sequence != lane[j-1].Sequence+1 {
				for _, ev := range lane[j:] {
					cut = append(cut, ev.ID)
				}
				lanes[i] = lane[:j]
				break
			}
		}
	}
	return cut
}
