package outbox

import (
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/pgident"
)

// partitionedSQL rewrites the lookups of every claim statement (it finds
// them by their text: a change to isHeadExcept, skippedFromSQL or
// successorsSQL that it no longer finds fails here), and leaves no head
// check that probes every partition but as the near check's fallback.
func TestPartitionedSQLRewritesEveryLookup(t *testing.T) {
	s, err := pgident.NewSchema("s")
	if err != nil {
		t.Fatal(err)
	}
	events := s.Table("outbox_events")
	plain := newRelaySQL(s, 100)
	parted := partitionedSQL(plain, events)
	for name, st := range map[string][2]string{
		"claim": {plain.claim, parted.claim}, "fastClaim": {plain.fastClaim, parted.fastClaim},
		"look": {plain.look, parted.look}, "claimLooked": {plain.claimLooked, parted.claimLooked},
		"claimIDs": {plain.claimIDs, parted.claimIDs}, "handOffWindow": {plain.handOffWindow, parted.handOffWindow},
	} {
		before, after := st[0], st[1]
		heads := strings.Count(before, "NOT EXISTS (\n\t\tSELECT 1 FROM (\n\t\t\tSELECT p.event_id, p.published_at")
		if heads == 0 {
			t.Errorf("%s: no head check found in the plain statement", name)
		}
		if n := strings.Count(after, ".aggregate_sequence = 1 OR (NOT EXISTS"); n != heads {
			t.Errorf("%s: %d near head checks, want %d (one per head check)", name, n, heads)
		}
		if strings.Contains(before, "FROM candidates c") && !strings.Contains(after, "CASE WHEN e.aggregate_sequence = 1 THEN 0 ELSE coalesce((") {
			t.Errorf("%s: the claimed heads' skip probe is not the near one", name)
		}
		if strings.Contains(before, successorsKey) && !strings.Contains(after, successorsNear) {
			t.Errorf("%s: the successors' lookup is not bounded", name)
		}
	}
}
