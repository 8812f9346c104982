package outbox

import "testing"

// TestClaimedLanesForgetsUnorderedLanes: a lane set aside at k is forgotten
// when this relay claims k (claimCursor.claimedLanes), also when the claim
// statement returned the lane's rows out of sequence order (it returns them
// in no particular order; orderLanes sorts them after claimedLanes ran).
// Taking the lane's first and last rows as its span, [k+1, k] spanned
// nothing and the lane stayed set aside, to be looked for again by key and
// under a lock once the cursor passed it.
func TestClaimedLanesForgetsUnorderedLanes(t *testing.T) {
	ev := func(seq int64) claimedEvent {
		var e claimedEvent
		e.AggregateType, e.AggregateID, e.Sequence = "order", "o-1", seq
		return e
	}
	for _, lane := range [][]claimedEvent{
		{ev(7), ev(8)},
		{ev(8), ev(7)},
		{ev(8), ev(6), ev(7)},
	} {
		var c claimCursor
		c.ahead = []laneAhead{{laneNext: laneNext{typ: "order", id: "o-1", seq: 7}}}
		c.claimedLanes(batch{lanes: [][]claimedEvent{lane}})
		if len(c.ahead) != 0 {
			t.Errorf("lane claimed as sequences %v: still set aside at 7", seqs(lane))
		}
	}
}

func seqs(lane []claimedEvent) []int64 {
	var s []int64
	for _, e := range lane {
		s = append(s, e.Sequence)
	}
	return s
}
