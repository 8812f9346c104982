package destinationtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// The failures orderAcrossRetries injects into an event's first attempt,
// chosen by the event id's last byte.
const (
	faultNone     = iota
	faultRefused  // the attempt fails before anything is sent
	faultAckLost  // the message is sent, but the relay is told it failed
	faultKinds    = 5
	orderAggs     = 6
	orderPerAgg   = 20
	orderDeadline = 2 * time.Minute
)

func fault(m outbox.Message) int {
	if m.Attempt != 1 {
		return faultNone
	}
	switch m.ID[15] % faultKinds {
	case 0:
		return faultRefused
	case 1:
		return faultAckLost
	}
	return faultNone
}

// faulty wraps p so that about a fifth of first attempts fail before they are
// sent and another fifth after (a lost acknowledgement, which makes the relay
// send the message again: a duplicate at the destination). When p declares
// ordered pipelining, so does the wrapper, and it keeps the promise: after an
// aggregate's first failure in a call, its later messages fail too, and
// after a failure before sending they are not sent.
func faulty(p outbox.Publisher) outbox.Publisher {
	f := &faultyPublisher{next: p}
	if op, ok := p.(outbox.OrderedPipeliner); ok && op.OrderedPipelining() {
		return faultyPipeliner{f}
	}
	return f
}

type faultyPublisher struct{ next outbox.Publisher }

type faultyPipeliner struct{ *faultyPublisher }

func (faultyPipeliner) OrderedPipelining() bool { return true }

func (f *faultyPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	var send []outbox.Message
	var at []int
	unsent := map[string]bool{} // aggregates with a message refused before sending
	for i, m := range msgs {
		key := m.AggregateType + "/" + m.AggregateID
		if unsent[key] {
			errs[i] = errors.New("destinationtest: not sent after its aggregate's injected failure")
			continue
		}
		if fault(m) == faultRefused {
			errs[i] = errors.New("destinationtest: injected failure before sending")
			unsent[key] = true
			continue
		}
		send = append(send, m)
		at = append(at, i)
	}
	if len(send) > 0 {
		sent := f.next.Publish(ctx, send)
		for k, i := range at {
			if sent != nil {
				errs[i] = sent[k]
			}
			if errs[i] == nil && fault(msgs[i]) == faultAckLost {
				errs[i] = errors.New("destinationtest: injected loss of the acknowledgement")
			}
		}
	}
	// Results per aggregate: successes, then only failures.
	failed := map[string]bool{}
	for i, m := range msgs {
		key := m.AggregateType + "/" + m.AggregateID
		if failed[key] && errs[i] == nil {
			errs[i] = errors.New("destinationtest: reported failed after its aggregate's failure")
		}
		failed[key] = failed[key] || errs[i] != nil
	}
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// orderAcrossRetries runs a real relay over a schema of the test's own: the
// events of several aggregates, written interleaved, go through the
// destination with injected failures; read back, each aggregate's events
// first appear in sequence order and none is missing.
func orderAcrossRetries(t *testing.T, d Destination) {
	tg := open(t, d.Open)
	ctx := testCtx(t, orderDeadline+time.Minute)
	pool, schema := outboxtest.Schema(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	aggs := make([]string, orderAggs)
	for a := range aggs {
		aggs[a] = fmt.Sprintf("agg-%d", a)
	}
	for seq := 1; seq <= orderPerAgg; seq++ {
		evs := make([]outbox.Event, 0, len(aggs))
		for a, id := range aggs {
			typ := AggregateTypes[a%len(AggregateTypes)]
			evs = append(evs, outbox.Event{AggregateType: typ, AggregateID: id, Type: "Step",
				Payload: fmt.Appendf(nil, `{"aggregate":%q,"step":%d}`, id, seq)})
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.InsertTx(ctx, tx, evs...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}

	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{
		Publisher: faulty(tg.Publisher), Schema: schema, BatchSize: 16,
		PollInterval: 20 * time.Millisecond, RetryBackoffMin: 5 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond,
		MaxAttempts: 1000, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRelay := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- relay.Run(runCtx) }()
	waitPublished(t, ctx, pool, schema)
	stopRelay()
	if err := <-ran; err != nil {
		t.Fatalf("relay: %v", err)
	}

	total := len(aggs) * orderPerAgg
	ds := read(t, ctx, tg, total)
	last := map[string]int64{}
	for _, dv := range ds {
		m := dv.Message
		switch prev := last[m.AggregateID]; {
		case m.Sequence <= prev: // a duplicate of a delivered event: allowed
		case m.Sequence == prev+1:
			last[m.AggregateID] = m.Sequence
		default:
			t.Errorf("aggregate %s: event %d first delivered after %d: out of order (or %d..%d missing)",
				m.AggregateID, m.Sequence, prev, prev+1, m.Sequence-1)
			last[m.AggregateID] = m.Sequence
		}
	}
	for _, id := range aggs {
		if last[id] != orderPerAgg {
			t.Errorf("aggregate %s: delivered through %d, want %d", id, last[id], orderPerAgg)
		}
	}
	t.Logf("%d events, %d deliveries (%d duplicates from lost acknowledgements)", total, len(ds), len(ds)-total)
}

// waitPublished waits until every event of the schema is marked published.
func waitPublished(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) {
	t.Helper()
	deadline := time.Now().Add(orderDeadline)
	var left int
	for time.Now().Before(deadline) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE published_at IS NULL`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%d events still unpublished after %s", left, orderDeadline)
}
