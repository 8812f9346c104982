// Package operatortest holds a scenario that every operator interface (the
// Admin API, `outbox quarantine`, the console) is put through: retries and
// skips of quarantined events at every position of a lane, checked at a real
// destination (NATS JetStream) and by an inbox.
package operatortest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// Operator is one way an operator acts on a quarantined event. Retry and
// Skip return nil when the action was done, and otherwise an error whose
// text is what the interface showed the operator.
type Operator interface {
	Retry(id uuid.UUID) error
	Skip(id uuid.UUID, reason string) error
}

// NewOperator returns the Operator under test for a schema.
type NewOperator func(t *testing.T, pool *pgxpool.Pool, schema string) Operator

// LanePositions runs the scenario of issue 19, item 2 through op. Three
// aggregates P, Q and R have events #1, #2, #3; each #2 is quarantined
// while #1 is not settled (as a relay did, before the fix, with a row it
// could not read behind a pending event, and as anyone can by hand):
//
//   - P: #1 is pending (the destination keeps failing it, retryably). A skip
//     of P#2 must be refused, naming P#1; had it been accepted, P#3 would
//     have been a head and gone out before P#1. Once P#1 is published, the
//     skip of P#2 (now the head) is accepted and P#3 goes out declaring it.
//   - Q: #1 is quarantined too. A skip of Q#2 first must be refused, naming
//     Q#1; then Q#1 is skipped (Q#2 becomes the head, still quarantined, and
//     the lane stays parked), then Q#2: Q#3 goes out declaring both skipped.
//   - R: #1 is quarantined too. A retry of R#2 first is accepted (R#2 waits
//     parked behind R#1); then R#1 is retried: #1, #2, #3 go out in order.
//
// At the destination, per aggregate, no event reaches it before an earlier
// unskipped one, each skip is declared (SkippedFrom), and an inbox applies
// every message as it comes: it neither waits for a skipped event nor
// applies one out of order.
func LanePositions(t *testing.T, newOperator NewOperator) {
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	js := natstest.JetStream(t, natstest.Conn(t))
	natsCfg := natstest.Config(t)
	dest := natstest.Publisher(t, js, natsCfg)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	for _, agg := range []string{"P", "Q", "R"} {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var evs []outbox.Event
			for _, typ := range []string{"Created", "Paid", "Shipped"} {
				evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: agg, Type: typ, Payload: []byte(`{}`)})
			}
			_, err := w.InsertTx(ctx, tx, evs...)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET quarantined_at = now(), attempt_count = 1,
	last_error = 'quarantined behind an unsettled event' WHERE aggregate_sequence = 2`); err != nil {
		t.Fatal(err)
	}
	id := func(agg string, seq int64) uuid.UUID {
		t.Helper()
		var id uuid.UUID
		if err := pool.QueryRow(ctx, `SELECT event_id FROM `+schema+`.outbox_events WHERE aggregate_id = $1 AND aggregate_sequence = $2`,
			agg, seq).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	state := func(agg string, seq int64) string {
		t.Helper()
		e, err := admin.Event(ctx, id(agg, seq))
		if err != nil {
			t.Fatal(err)
		}
		return e.State()
	}

	var holdP, refuseQR atomic.Bool
	holdP.Store(true)
	refuseQR.Store(true)
	var attemptsP atomic.Int64
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		errs := make([]error, len(msgs))
		var pass []outbox.Message
		var idx []int
		for i, m := range msgs {
			switch {
			case m.AggregateID == "P" && m.Sequence == 1 && holdP.Load():
				attemptsP.Add(1)
				errs[i] = errors.New("destination busy, try again")
			case m.AggregateID != "P" && m.Sequence == 1 && refuseQR.Load():
				errs[i] = outbox.Permanent(errors.New("refused by the destination"))
			default:
				pass = append(pass, m)
				idx = append(idx, i)
			}
		}
		if len(pass) > 0 {
			for j, err := range dest.Publish(ctx, pass) {
				errs[idx[j]] = err
			}
		}
		return errs
	})
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: pub, PollInterval: 20 * time.Millisecond,
		RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond, MaxAttempts: 1 << 20,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	outboxtest.Eventually(t, 30*time.Second, "Q#1 and R#1 quarantined, P#1 failing", func() bool {
		return state("Q", 1) == "quarantined" && state("R", 1) == "quarantined" && attemptsP.Load() > 0
	})
	op := newOperator(t, pool, schema)
	refused := func(err error, what string, head uuid.UUID) bool {
		t.Helper()
		switch {
		case err == nil:
			t.Errorf("%s was accepted; want it refused, naming %s", what, head)
			return false
		case !strings.Contains(err.Error(), head.String()):
			t.Errorf("%s refused with %q; want the refusal to name %s", what, err, head)
		}
		return true
	}
	parked := func(agg string, seq int64) bool {
		t.Helper()
		var parked bool
		if err := pool.QueryRow(ctx, `SELECT available_at = 'infinity' FROM `+schema+`.outbox_events WHERE event_id = $1`,
			id(agg, seq)).Scan(&parked); err != nil {
			t.Fatal(err)
		}
		return parked
	}

	// P: #1 pending, #2 quarantined.
	pRefused := refused(op.Skip(id("P", 2), "skip behind a pending event"), "skip of P#2 while P#1 is pending", id("P", 1))
	// The relay's chance to publish P#3 ahead of P#1, had the skip gone
	// through: P#1 is tried again several times meanwhile.
	n := attemptsP.Load()
	outboxtest.Eventually(t, 30*time.Second, "P#1 tried five more times", func() bool {
		return attemptsP.Load() >= n+5 || state("P", 3) == "published"
	})
	holdP.Store(false)
	outboxtest.Eventually(t, 30*time.Second, "P#1 published", func() bool { return state("P", 1) == "published" })
	if pRefused {
		if err := op.Skip(id("P", 2), "P#2 is now the head"); err != nil {
			t.Fatalf("skip of P#2 once P#1 is published: %v", err)
		}
	}

	// Q: #1 and #2 quarantined; skip #2 first.
	qRefused := refused(op.Skip(id("Q", 2), "skip behind a quarantined event"), "skip of Q#2 while Q#1 is quarantined", id("Q", 1))
	if err := op.Skip(id("Q", 1), "Q#1 first"); err != nil {
		t.Fatalf("skip of Q#1: %v", err)
	}
	if qRefused {
		if s := state("Q", 2); s != "quarantined" || !parked("Q", 3) {
			t.Fatalf("after the skip of Q#1: Q#2 %s, Q#3 parked %v; want Q#2 the quarantined head and Q#3 parked behind it", s, parked("Q", 3))
		}
		if err := op.Skip(id("Q", 2), "Q#2 is now the head"); err != nil {
			t.Fatalf("skip of Q#2 once Q#1 is skipped: %v", err)
		}
	}

	// R: #1 and #2 quarantined; retry #2 first.
	if err := op.Retry(id("R", 2)); err != nil {
		t.Fatalf("retry of R#2 behind the quarantined R#1: %v", err)
	}
	if s := state("R", 2); s != "pending" || !parked("R", 2) || !parked("R", 3) {
		t.Errorf("after the retry of R#2: R#2 %s, parked %v, R#3 parked %v; want both pending and parked behind R#1", s, parked("R", 2), parked("R", 3))
	}
	refuseQR.Store(false)
	if err := op.Retry(id("R", 1)); err != nil {
		t.Fatalf("retry of R#1: %v", err)
	}

	outboxtest.Eventually(t, 30*time.Second, "every lane settled", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE published_at IS NULL`).Scan(&n)
		return err == nil && n == 0
	})
	msgs := readStream(t, js, natsCfg.Stream)
	firsts := CheckOrder(t, msgs)
	want := map[string]string{"order/P": "[1 3 (skipped from 2)]", "order/Q": "[3 (skipped from 1)]", "order/R": "[1 2 3]"}
	for agg, w := range want {
		var got []string
		for _, m := range firsts[agg] {
			s := fmt.Sprint(m.Sequence)
			if m.SkippedFrom != 0 {
				s += fmt.Sprintf(" (skipped from %d)", m.SkippedFrom)
			}
			got = append(got, s)
		}
		if g := "[" + strings.Join(got, " ") + "]"; g != w {
			t.Errorf("%s at the destination: %s, want %s", agg, g, w)
		}
	}

	in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "lane-positions"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		out, err := in.Handle(ctx, m, func(context.Context, pgx.Tx) error { return nil })
		if err != nil || out != inbox.Applied {
			t.Errorf("inbox on %s #%d (skipped from %d): %v, %v; want it applied as it comes", m.AggregateID, m.Sequence, m.SkippedFrom, out, err)
		}
	}
}

// CheckOrder asserts I5 at the destination when events may have been
// skipped: per aggregate, the first delivery of each event follows the last
// one's sequence, or declares (SkippedFrom) that the sequences between were
// skipped. It returns the first deliveries per aggregate, in order.
func CheckOrder(t testing.TB, msgs []outbox.Message) map[string][]outbox.Message {
	t.Helper()
	last := map[string]int64{}
	seen := map[uuid.UUID]bool{}
	out := map[string][]outbox.Message{}
	for _, m := range msgs {
		if seen[m.ID] || m.ReplayID != uuid.Nil {
			continue
		}
		seen[m.ID] = true
		key := m.AggregateType + "/" + m.AggregateID
		want := last[key] + 1
		if m.Sequence != want && (m.SkippedFrom == 0 || m.SkippedFrom > want || m.Sequence < want) {
			t.Errorf("I5 violated: aggregate %s: #%d (skipped from %d) reached the destination after #%d", key, m.Sequence, m.SkippedFrom, last[key])
		}
		last[key] = max(last[key], m.Sequence)
		out[key] = append(out[key], m)
	}
	return out
}

// readStream reads a whole stream back, in stream order.
func readStream(t testing.TB, js jetstream.JetStream, stream string) []outbox.Message {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []outbox.Message
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		raw, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get stream message %d: %v", seq, err)
		}
		m, err := outboxnats.Decode(raw.Header, raw.Data)
		if err != nil {
			t.Fatalf("decode stream message %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}
