package inbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
)

// TestWaitingPages: walking Admin.Waiting page by page with After lists
// every waiting aggregate once, in the unpaged order, also when several
// waits started in the same transaction (same waiting_since).
func TestWaitingPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupStart(t, inbox.Config{})
	for i := range 7 {
		b.deliver(t, outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i), Sequence: 2, Type: "T", Payload: []byte(`{}`)}, inbox.Early)
	}
	// Three waits with one waiting_since: only the rest of the key orders them.
	if _, err := b.pool.Exec(ctx, `UPDATE `+b.schema+`.inbox_aggregates SET waiting_since = '2026-01-01T00:00:00Z' WHERE aggregate_id IN ('o-4', 'o-1', 'o-6')`); err != nil {
		t.Fatal(err)
	}
	all, err := b.admin.Waiting(ctx, inbox.WaitingFilter{})
	if err != nil || len(all.Aggregates) != 7 {
		t.Fatalf("unpaged: %d aggregates, %v; want 7", len(all.Aggregates), err)
	}
	var walked []string
	f := inbox.WaitingFilter{Limit: 2}
	for pages := 0; pages < 6; pages++ {
		rep, err := b.admin.Waiting(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Aggregates) == 0 {
			break
		}
		for _, a := range rep.Aggregates {
			walked = append(walked, a.AggregateID)
		}
		c := rep.Aggregates[len(rep.Aggregates)-1].WaitingCursor()
		f.After = &c
	}
	if len(walked) != 7 {
		t.Fatalf("pages of 2 walked %v, want 7 aggregates", walked)
	}
	for i, a := range all.Aggregates {
		if walked[i] != a.AggregateID {
			t.Fatalf("aggregate %d: paged %s, unpaged %s (paged %v)", i, walked[i], a.AggregateID, walked)
		}
	}
	if walked[0] != "o-1" || walked[1] != "o-4" || walked[2] != "o-6" {
		t.Fatalf("the oldest waits first, by id within one time: got %v", walked[:3])
	}
}
