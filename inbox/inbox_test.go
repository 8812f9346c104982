package inbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// setup is an inbox of kind k over a schema of its own, with an effects
// table: handle delivers a message whose effect inserts a row there,
// effects counts the rows.
func setup(t *testing.T, k txKind) (*inbox.Inbox, func(outbox.Message) (inbox.Outcome, error), func() int) {
	t.Helper()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".effects (event_id uuid, seq bigint)"); err != nil {
		t.Fatal(err)
	}
	in := k.newInbox(t, pool, inbox.Config{Tables: outbox.Schema(schema), Consumer: "c1"})
	handle := func(m outbox.Message) (inbox.Outcome, error) {
		return k.handle(ctx, in, m, func(ctx context.Context, exec execFunc) error {
			return exec(ctx, "INSERT INTO "+schema+".effects VALUES ($1, $2)", m.ID, m.Sequence)
		})
	}
	effects := func() int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".effects").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	return in, handle, effects
}

func msg(id string, seq int64) outbox.Message {
	return outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: id, Sequence: seq, Type: "T"}
}

func TestDuplicatesAppliedOnce(t *testing.T) {
	t.Parallel()
	forKinds(t, testDuplicatesAppliedOnce)
}

func testDuplicatesAppliedOnce(t *testing.T, k txKind) {
	in, handle, effects := setup(t, k)
	m1, m2 := msg("o1", 1), msg("o1", 2)
	for i, c := range []struct {
		m    outbox.Message
		want inbox.Outcome
	}{{m1, inbox.Applied}, {m1, inbox.Duplicate}, {m2, inbox.Applied}, {m1, inbox.Duplicate}, {m2, inbox.Duplicate}} {
		got, err := handle(c.m)
		if err != nil || got != c.want {
			t.Fatalf("delivery %d (seq %d): %v, %v; want %v", i, c.m.Sequence, got, err, c.want)
		}
	}
	if n := effects(); n != 2 {
		t.Fatalf("%d effects, want 2", n)
	}
	last, err := in.LastSequence(context.Background(), "order", "o1")
	if err != nil || last != 2 {
		t.Fatalf("LastSequence = %d, %v; want 2", last, err)
	}
}

func TestOutOfOrderIsNotApplied(t *testing.T) {
	t.Parallel()
	forKinds(t, testOutOfOrderIsNotApplied)
}

func testOutOfOrderIsNotApplied(t *testing.T, k txKind) {
	_, handle, effects := setup(t, k)
	m1, m2, m3 := msg("o1", 1), msg("o1", 2), msg("o1", 3)
	if got, _ := handle(m3); got != inbox.Early {
		t.Fatalf("seq 3 first: %v, want early", got)
	}
	if got, _ := handle(m1); got != inbox.Applied {
		t.Fatalf("seq 1: %v, want applied", got)
	}
	if got, _ := handle(m3); got != inbox.Early {
		t.Fatalf("seq 3 before 2: %v, want early", got)
	}
	if got, _ := handle(m2); got != inbox.Applied {
		t.Fatalf("seq 2: %v", got)
	}
	if got, _ := handle(m3); got != inbox.Applied {
		t.Fatalf("seq 3 redelivered: %v", got)
	}
	if got, _ := handle(msg("o2", 1)); got != inbox.Applied {
		t.Fatalf("another aggregate: %v", got)
	}
	if n := effects(); n != 4 {
		t.Fatalf("%d effects, want 4", n)
	}
}

func TestEffectErrorRollsBackInboxRow(t *testing.T) {
	t.Parallel()
	forKinds(t, testEffectErrorRollsBackInboxRow)
}

func testEffectErrorRollsBackInboxRow(t *testing.T, k txKind) {
	ctx := context.Background()
	in, handle, effects := setup(t, k)
	m := msg("o1", 1)
	boom := errors.New("effect failed")
	if _, err := k.handle(ctx, in, m, func(context.Context, execFunc) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("error %v, want the effect's", err)
	}
	// Nothing was recorded: the redelivery applies.
	if got, err := handle(m); got != inbox.Applied || err != nil {
		t.Fatalf("redelivery after a failed effect: %v, %v", got, err)
	}
	if n := effects(); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

// TestConcurrentDuplicateDeliveries hands the same events to many goroutines
// at once: each is applied exactly once.
func TestConcurrentDuplicateDeliveries(t *testing.T) {
	t.Parallel()
	forKinds(t, testConcurrentDuplicateDeliveries)
}

func testConcurrentDuplicateDeliveries(t *testing.T, k txKind) {
	_, handle, effects := setup(t, k)
	msgs := []outbox.Message{msg("o1", 1), msg("o1", 2), msg("o1", 3), msg("o2", 1)}
	var wg sync.WaitGroup
	var mu sync.Mutex
	applied := 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < 6; round++ {
				for _, m := range msgs {
					got, err := handle(m)
					if err != nil {
						t.Error(err)
						return
					}
					if got == inbox.Applied {
						mu.Lock()
						applied++
						mu.Unlock()
					}
				}
			}
		}()
	}
	wg.Wait()
	if applied != len(msgs) || effects() != len(msgs) {
		t.Fatalf("applied %d, effects %d; want %d each", applied, effects(), len(msgs))
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	pool := outboxtest.Pool(t)
	if _, err := inbox.New(pool, inbox.Config{}); err == nil {
		t.Fatal("missing consumer name accepted")
	}
	if _, err := inbox.New(pool, inbox.Config{Consumer: "c", Schema: "bad name"}); err == nil {
		t.Fatal("bad schema accepted")
	}
	in, _ := inbox.New(pool, inbox.Config{Consumer: "c"})
	if _, err := in.Handle(context.Background(), outbox.Message{ID: uuid.New()}, nil); err == nil {
		t.Fatal("message without aggregate accepted")
	}
}
