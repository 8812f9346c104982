package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// orderPlacedV1 is the payload of OrderPlaced before the change: the total
// as a decimal string, in euros.
type orderPlacedV1 struct {
	Total string `json:"total"`
}

// orderPlacedV2 is the payload after it: integer cents and a currency.
type orderPlacedV2 struct {
	TotalCents int64  `json:"total_cents"`
	Currency   string `json:"currency"`
}

// upgradeOrderPlaced is the v1 -> v2 upcaster.
func upgradeOrderPlaced(payload []byte) ([]byte, error) {
	var v1 orderPlacedV1
	if err := json.Unmarshal(payload, &v1); err != nil {
		return nil, err
	}
	euros, cents, _ := strings.Cut(v1.Total, ".")
	e, err := strconv.ParseInt(euros, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("total %q: %w", v1.Total, err)
	}
	c, err := strconv.ParseInt((cents + "00")[:2], 10, 64)
	if err != nil {
		return nil, fmt.Errorf("total %q: %w", v1.Total, err)
	}
	return json.Marshal(orderPlacedV2{TotalCents: e*100 + c, Currency: "EUR"})
}

func TestUpcastersChainAndErrors(t *testing.T) {
	t.Parallel()
	var up inbox.Upcasters
	up.MustRegister("OrderPlaced", 1, upgradeOrderPlaced)
	up.MustRegister("OrderPlaced", 2, func(p []byte) ([]byte, error) { // v3 adds a field
		var m map[string]any
		if err := json.Unmarshal(p, &m); err != nil {
			return nil, err
		}
		m["channel"] = "web"
		return json.Marshal(m)
	})
	got, err := up.Upcast(outbox.Message{Type: "OrderPlaced", SchemaVersion: 1, Payload: []byte(`{"total":"12.5"}`)})
	if err != nil || got.SchemaVersion != 3 || string(got.Payload) != `{"channel":"web","currency":"EUR","total_cents":1250}` {
		t.Fatalf("v1 upcast: v%d %s, %v; want v3 with cents, currency and channel", got.SchemaVersion, got.Payload, err)
	}
	if got, err := up.Upcast(outbox.Message{Type: "OrderPlaced", SchemaVersion: 3, Payload: []byte(`{}`)}); err != nil || got.SchemaVersion != 3 {
		t.Fatalf("current version changed: v%d, %v", got.SchemaVersion, err)
	}
	if got, err := up.Upcast(outbox.Message{Type: "OrderCancelled", Payload: []byte(`{}`)}); err != nil || got.SchemaVersion != 1 {
		t.Fatalf("type without upcasters: v%d, %v; want v1 unchanged", got.SchemaVersion, err)
	}
	if _, err := up.Upcast(outbox.Message{Type: "OrderPlaced", SchemaVersion: 1, Payload: []byte(`{"total":"x"}`)}); err == nil || !strings.Contains(err.Error(), "from v1 to v2") {
		t.Fatalf("failing upcaster: %v, want an error naming the step", err)
	}
	var nilUp *inbox.Upcasters
	if got, err := nilUp.Upcast(outbox.Message{Type: "OrderPlaced", SchemaVersion: 1}); err != nil || got.SchemaVersion != 1 {
		t.Fatalf("nil Upcasters: v%d, %v", got.SchemaVersion, err)
	}
	for _, bad := range []func() error{
		func() error { return up.Register("OrderPlaced", 1, upgradeOrderPlaced) },
		func() error { return up.Register("", 1, upgradeOrderPlaced) },
		func() error { return up.Register("X", 0, upgradeOrderPlaced) },
		func() error { return up.Register("X", 1, nil) },
	} {
		if bad() == nil {
			t.Fatal("bad registration accepted")
		}
	}
	var invalid inbox.Upcasters
	invalid.MustRegister("T", 1, func([]byte) ([]byte, error) { return []byte(`{`), nil })
	if _, err := invalid.Upcast(outbox.Message{Type: "T", SchemaVersion: 1, Payload: []byte(`{}`)}); err == nil {
		t.Fatal("an upcaster returning invalid JSON was accepted")
	}
}

// TestReplayOfV1EventsAfterAV2Change: OrderPlaced v1 events are published
// and applied by an old consumer; the payload then changes to v2 and new
// events are written as v2. A consumer deployed with only v2 code and the
// v1 -> v2 upcaster has the whole history replayed to it: every effect
// receives v2, and the old consumer drops the replayed events as duplicates.
func TestReplayOfV1EventsAfterAV2Change(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	js := natstest.JetStream(t, natstest.Conn(t))
	pub := natstest.Publisher(t, js, outboxnats.Config{})
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	write := func(order string, version int, payload string) {
		t.Helper()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: order, Type: "OrderPlaced", SchemaVersion: version, Payload: []byte(payload)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: pub, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	published := func(n int64) func() bool {
		return func() bool { return relay.Stats().Published >= n }
	}
	stream, err := js.Stream(ctx, pub.Stream())
	if err != nil {
		t.Fatal(err)
	}
	read := func(from uint64) ([]outbox.Message, uint64) {
		t.Helper()
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []outbox.Message
		for seq := max(from, info.State.FirstSeq); seq <= info.State.LastSeq; seq++ {
			raw, err := stream.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			m, err := outboxnats.Decode(raw.Header, raw.Data)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, m)
		}
		return out, info.State.LastSeq + 1
	}

	// Before the change: v1 events, applied by the old consumer.
	write("o1", 1, `{"total":"12.99"}`)
	write("o2", 1, `{"total":"5"}`)
	write("o1", 1, `{"total":"13.50"}`) // o1 amended
	outboxtest.Eventually(t, 30*time.Second, "v1 events published", published(3))
	old, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "billing-v1"})
	if err != nil {
		t.Fatal(err)
	}
	v1msgs, next := read(0)
	for _, m := range v1msgs {
		if out, err := old.Handle(ctx, m, func(context.Context, pgx.Tx) error { return nil }); err != nil || out != inbox.Applied {
			t.Fatalf("old consumer: %v, %v", out, err)
		}
	}

	// The change: new events are v2.
	write("o3", 2, `{"total_cents":700,"currency":"EUR"}`)
	write("o2", 2, `{"total_cents":550,"currency":"EUR"}`)
	outboxtest.Eventually(t, 30*time.Second, "v2 events published", published(5))

	// A v2-only consumer has everything replayed to it.
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	afterV2 := next
	_, next = read(next)
	if _, err := admin.Replay(ctx, pub, outbox.ReplayConfig{AggregateType: "order", By: "test"}); err != nil {
		t.Fatal(err)
	}
	replayed, _ := read(next)
	if len(replayed) != 5 {
		t.Fatalf("%d replayed messages, want 5", len(replayed))
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.order_totals (order_id text PRIMARY KEY, total_cents bigint, currency text)`); err != nil {
		t.Fatal(err)
	}
	var up inbox.Upcasters
	up.MustRegister("OrderPlaced", 1, upgradeOrderPlaced)
	reporting, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "reporting-v2", Upcasters: &up})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seenVersions := map[int]int{}
	for _, m := range replayed {
		out, err := reporting.HandleMessage(ctx, m, func(ctx context.Context, tx pgx.Tx, m outbox.Message) error {
			mu.Lock()
			seenVersions[m.SchemaVersion]++
			mu.Unlock()
			var p orderPlacedV2
			if err := json.Unmarshal(m.Payload, &p); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.order_totals VALUES ($1, $2, $3)
				ON CONFLICT (order_id) DO UPDATE SET total_cents = EXCLUDED.total_cents, currency = EXCLUDED.currency`,
				m.AggregateID, p.TotalCents, p.Currency)
			return err
		})
		if err != nil || out != inbox.Applied {
			t.Fatalf("reporting on %s #%d v%d: %v, %v", m.AggregateID, m.Sequence, m.SchemaVersion, out, err)
		}
	}
	if seenVersions[2] != 5 || len(seenVersions) != 1 {
		t.Fatalf("effect saw schema versions %v, want only v2", seenVersions)
	}
	totals := map[string]int64{}
	rows, _ := pool.Query(ctx, `SELECT order_id, total_cents FROM `+schema+`.order_totals WHERE currency = 'EUR'`)
	var id string
	var cents int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &cents}, func() error { totals[id] = cents; return nil }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(totals) != "map[o1:1350 o2:550 o3:700]" {
		t.Fatalf("totals %v, want o1 1350 (v1 amended), o2 550 (v2), o3 700 (v2)", totals)
	}
	// The old consumer drops the replay: it applied those events already or
	// sees them as its own duplicates.
	all, _ := read(afterV2)
	for _, m := range all {
		if m.ReplayID == uuid.Nil {
			continue
		}
		out, err := old.Handle(ctx, m, func(context.Context, pgx.Tx) error {
			if m.SchemaVersion == 1 {
				return errors.New("old consumer re-applied a v1 event")
			}
			return nil // a v2 event it had not seen (it stopped before the change)
		})
		if err != nil {
			t.Fatal(err)
		}
		if m.SchemaVersion == 1 && out != inbox.Duplicate {
			t.Fatalf("old consumer on replayed v1 %s #%d: %v, want duplicate", m.AggregateID, m.Sequence, out)
		}
	}
}

// TestSkippedEventsDoNotLeaveAGap: an event declaring that the events before
// it were skipped is applied although they never arrive; a declaration that
// does not cover the gap is not.
func TestSkippedEventsDoNotLeaveAGap(t *testing.T) {
	t.Parallel()
	forKinds(t, testSkippedEventsDoNotLeaveAGap)
}

func testSkippedEventsDoNotLeaveAGap(t *testing.T, k txKind) {
	_, handle, effects := setup(t, k)
	m1 := msg("o1", 1)
	m4 := msg("o1", 4)
	m4.SkippedFrom = 3 // 3 skipped, but 2 is still missing
	if got, _ := handle(m1); got != inbox.Applied {
		t.Fatalf("seq 1: %v", got)
	}
	if got, _ := handle(m4); got != inbox.Early {
		t.Fatalf("seq 4 skipping only 3 after 1: %v, want early", got)
	}
	m4.SkippedFrom = 2
	if got, _ := handle(m4); got != inbox.Applied {
		t.Fatalf("seq 4 skipping 2..3 after 1: %v, want applied", got)
	}
	if got, _ := handle(msg("o1", 3)); got != inbox.Duplicate {
		t.Fatalf("a skipped sequence arriving late: %v, want duplicate", got)
	}
	if n := effects(); n != 2 {
		t.Fatalf("%d effects, want 2", n)
	}
}

type outcomeCounter struct {
	mu  sync.Mutex
	got map[string]int
}

func (c *outcomeCounter) ObserveHandle(o inbox.HandleObservation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := o.Outcome.String()
	if o.Err != nil {
		key = "error"
	}
	c.got[o.Consumer+"/"+o.EventType+"/"+key]++
}

// TestObserverSeesEveryOutcome, through HandleMessage (HandleMessageSQL) and
// with an upcaster, on both kinds of transaction.
func TestObserverSeesEveryOutcome(t *testing.T) {
	t.Parallel()
	forKinds(t, testObserverSeesEveryOutcome)
}

func testObserverSeesEveryOutcome(t *testing.T, k txKind) {
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	obs := &outcomeCounter{got: map[string]int{}}
	up := &inbox.Upcasters{}
	up.MustRegister("T", 1, func(p []byte) ([]byte, error) { return []byte(`{"v":2}`), nil })
	in := k.newInbox(t, pool, inbox.Config{Schema: schema, Consumer: "c", Observer: obs, Upcasters: up})
	var seen []string
	noop := func(_ context.Context, _ execFunc, m outbox.Message) error {
		seen = append(seen, fmt.Sprintf("%d:%s", m.SchemaVersion, m.Payload))
		return nil
	}
	m1, m2, m3 := msg("o1", 1), msg("o1", 2), msg("o1", 3)
	for _, m := range []*outbox.Message{&m1, &m2, &m3} {
		m.SchemaVersion, m.Payload = 1, []byte(`{"v":1}`)
	}
	for _, m := range []outbox.Message{m1, m1, m3, m2} {
		if _, err := k.handleMessage(ctx, in, m, noop); err != nil {
			t.Fatal(err)
		}
	}
	if got := fmt.Sprint(seen); got != `[2:{"v":2} 2:{"v":2}]` {
		t.Fatalf("the effect saw %s, want the two applied messages upgraded to version 2", got)
	}
	if _, err := k.handleMessage(ctx, in, m3, func(context.Context, execFunc, outbox.Message) error { return errors.New("boom") }); err == nil {
		t.Fatal("effect error lost")
	}
	want := "map[c/T/applied:2 c/T/duplicate:1 c/T/early:1 c/T/error:1]"
	if fmt.Sprint(obs.got) != want {
		t.Fatalf("observed %v, want %s", obs.got, want)
	}
}
