package outboxamqp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// TestRoundTrip: every field of a message crosses Publish, the broker and an
// independent consumer, and Decode returns it unchanged; the message is
// persistent, its message-id is the event id (also on a replay, which
// carries the replay id as an attribute) and the CloudEvents attributes are
// cloudEvents: application properties.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	p, b := setup(t, rabbittest.URL(), outboxamqp.Config{RoutingKey: "rt.{aggregate_type}.{aggregate_id}", Source: "/shop"}, "rt.#")

	plain := event("o-1", 1)
	plain.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-tenant": "acme corp é"}
	plain.OccurredAt = time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)
	proto := event("p-1", 7)
	proto.AggregateType = "payment"
	proto.ContentType = `application/x-protobuf; messageType="shop.PaymentTaken"`
	proto.Payload = []byte{0x0a, 0x03, 'p', '-', '1', 0x00, 0xff}
	proto.SchemaVersion = 3
	proto.SkippedFrom = 4
	replay := event("o 2 \"x\" 日本", 2)
	replay.ReplayID = uuid.New()
	replay.Payload = nil
	replay.ContentType = "application/octet-stream"
	msgs := []outbox.Message{plain, proto, replay}
	checkNil(t, p.Publish(testCtx(t), msgs))

	byID := map[uuid.UUID]outbox.Message{}
	for _, m := range msgs {
		m.Attempt = 0
		byID[m.ID] = m
	}
	for _, d := range b.read(t, len(msgs)) {
		got, err := outboxamqp.Decode(d)
		if err != nil {
			t.Fatal(err)
		}
		want, ok := byID[got.ID]
		if !ok {
			t.Fatalf("unknown event %s", got.ID)
		}
		delete(byID, got.ID)
		if len(got.Payload) == 0 {
			got.Payload = nil
		}
		if !sameMessage(got, want) {
			t.Errorf("round trip changed the message:\n got %+v\nwant %+v", got, want)
		}
		if wantKey := "rt." + want.AggregateType + "." + want.AggregateID; d.RoutingKey != wantKey || d.Exchange != b.exchange {
			t.Errorf("exchange %q routing key %q, want %q %q", d.Exchange, d.RoutingKey, b.exchange, wantKey)
		}
		if d.MessageId != want.ID.String() || d.DeliveryMode != amqp.Persistent || d.ContentType != want.ContentType {
			t.Errorf("message-id %q delivery mode %d content type %q", d.MessageId, d.DeliveryMode, d.ContentType)
		}
		for k, v := range map[string]string{"cloudEvents:specversion": "1.0", "cloudEvents:id": want.ID.String(), "cloudEvents:source": "/shop",
			"cloudEvents:type": want.Type, "cloudEvents:subject": want.AggregateID, "cloudEvents:aggregatetype": want.AggregateType,
			"cloudEvents:sequence": outbox.SequenceHeader(want.Sequence)} {
			if d.Headers[k] != v {
				t.Errorf("property %s = %v, want %q", k, d.Headers[k], v)
			}
		}
		if want.ReplayID != uuid.Nil && d.Headers["cloudEvents:replayid"] != want.ReplayID.String() {
			t.Errorf("replay: cloudEvents:replayid = %v, want %s", d.Headers["cloudEvents:replayid"], want.ReplayID)
		}
	}
}

// TestAggregateOrderOnQueue: across many publishes (one event per aggregate
// per call, as the relay sends them), the queue holds each aggregate's
// events in sequence order.
func TestAggregateOrderOnQueue(t *testing.T) {
	t.Parallel()
	p, b := setup(t, rabbittest.URL(), outboxamqp.Config{}, "outbox.order")
	const aggregates, rounds = 10, 10
	ctx := testCtx(t)
	for seq := int64(1); seq <= rounds; seq++ {
		wave := make([]outbox.Message, aggregates)
		for a := range wave {
			wave[a] = event(fmt.Sprintf("agg-%d", a), seq)
		}
		checkNil(t, p.Publish(ctx, wave))
	}
	last := map[string]int64{}
	for _, d := range b.read(t, aggregates*rounds) {
		m, err := outboxamqp.Decode(d)
		if err != nil {
			t.Fatal(err)
		}
		if m.Sequence != last[m.AggregateID]+1 {
			t.Fatalf("aggregate %s: sequence %d after %d", m.AggregateID, m.Sequence, last[m.AggregateID])
		}
		last[m.AggregateID] = m.Sequence
	}
}

// TestRefusalsAreClassifiedAlone: a message whose routing key no queue is
// bound for comes back (mandatory) and fails, alone, as its route being
// unavailable (the route is missing, nothing is wrong with the message: it
// must never be permanent); one over MaxMessageBytes and one whose routing
// key is too long fail as permanent, before sending; the others of the same
// call are stored.
func TestRefusalsAreClassifiedAlone(t *testing.T) {
	t.Parallel()
	p, b := setup(t, rabbittest.URL(), outboxamqp.Config{MaxMessageBytes: 4096}, "outbox.order")
	nowhere := event("n-1", 1)
	nowhere.AggregateType = "nowhere"
	big := event("o-2", 1)
	big.Payload = bytes.Repeat([]byte("x"), 5000)
	long := event("o-4", 1)
	long.AggregateType = strings.Repeat("o", 250)
	nowhere2 := event("n-2", 1)
	nowhere2.AggregateType = "nowhere"
	msgs := []outbox.Message{event("o-1", 1), nowhere, big, event("o-3", 1), long, nowhere2, event("o-5", 1)}
	errs := p.Publish(testCtx(t), msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("Publish errors %v, want one per message", errs)
	}
	for i, err := range errs {
		switch i {
		case 1, 5:
			if route, ok := outbox.UnavailableRoute(err); !ok || route != "outbox.nowhere" || outbox.IsPermanent(err) {
				t.Errorf("message %d: %v, want an error marked RouteUnavailable(\"outbox.nowhere\")", i, err)
			}
		case 2, 4:
			if !outbox.IsPermanent(err) || outbox.IsUnavailable(err) {
				t.Errorf("message %d: %v, want a permanent error", i, err)
			}
		default:
			if err != nil {
				t.Errorf("message %d: %v, want success", i, err)
			}
		}
	}
	if !strings.Contains(fmt.Sprint(errs[1]), "NO_ROUTE") {
		t.Errorf("unroutable: %v does not say NO_ROUTE", errs[1])
	}
	got := map[string]bool{}
	for _, d := range b.read(t, 3) {
		got[d.MessageId] = true
	}
	for _, i := range []int{0, 3, 6} {
		if !got[msgs[i].ID.String()] {
			t.Errorf("message %d is not in the queue", i)
		}
	}
	// The channel stays usable: the next call succeeds.
	checkNil(t, p.Publish(testCtx(t), []outbox.Message{event("o-6", 1)}))
}

// TestMissingExchangeIsUnavailable: with NoDeclare and no exchange, Probe
// says the broker cannot be used and Publish fails every message without
// spending an attempt (the configuration is wrong, not the messages).
func TestMissingExchangeIsUnavailable(t *testing.T) {
	t.Parallel()
	p, err := outboxamqp.NewPublisher(outboxamqp.Config{URL: rabbittest.URL(), Exchange: rabbittest.UniqueName("outboxtest-none"), NoDeclare: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.Probe(testCtx(t)); err == nil || !strings.Contains(err.Error(), "NOT_FOUND") {
		t.Fatalf("Probe: %v, want NOT_FOUND", err)
	}
	errs := p.Publish(testCtx(t), []outbox.Message{event("o-1", 1), event("o-2", 1)})
	for i, err := range errs {
		if !outbox.IsUnavailable(err) {
			t.Errorf("message %d: %v, want unavailable", i, err)
		}
	}
	if errs == nil {
		t.Fatal("Publish to a missing exchange succeeded")
	}
}

// TestUnreachableIsUnavailable: with nothing listening on the port, Publish
// fails every message as unavailable and so does Probe, quickly.
func TestUnreachableIsUnavailable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := l.Addr().String()
	l.Close()
	p, err := outboxamqp.NewPublisher(outboxamqp.Config{URL: "amqp://guest:s3cret-pw@" + free + "/", DialTimeout: time.Second, ConfirmTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx := testCtx(t)
	msgs := []outbox.Message{event("o-1", 1), event("o-2", 1)}
	errs := p.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("Publish errors %v, want one per message", errs)
	}
	for i, err := range errs {
		if !outbox.IsUnavailable(err) {
			t.Errorf("message %d: %v, want unavailable", i, err)
		}
		if strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("message %d: %v repeats the password", i, err)
		}
	}
	err = p.Probe(ctx)
	if !outbox.IsUnavailable(err) {
		t.Errorf("Probe: %v, want unavailable", err)
	}
	if strings.Contains(fmt.Sprint(err), "s3cret-pw") {
		t.Errorf("Probe: %v repeats the password", err)
	}
}

// TestBadPasswordIsNeverPrinted: a password the broker refuses makes
// Publish and Probe fail as unavailable, and neither the errors nor the
// Config's String and %+v / %#v output repeat it.
func TestBadPasswordIsNeverPrinted(t *testing.T) {
	t.Parallel()
	const pw = "n0t-the-Passw0rd"
	cfg, err := outboxamqp.ParseURL("amqp://guest:" + pw + "@127.0.0.1:5672/?exchange=" + rabbittest.UniqueName("outboxtest-x"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{cfg.String(), fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), fmt.Sprint(&cfg)} {
		if strings.Contains(s, pw) || !strings.Contains(s, "guest:xxxxx@127.0.0.1") {
			t.Errorf("printed config %q: want the password redacted", s)
		}
	}
	p, err := outboxamqp.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	errs := p.Publish(testCtx(t), []outbox.Message{event("o-1", 1)})
	if len(errs) != 1 || !outbox.IsUnavailable(errs[0]) {
		t.Fatalf("Publish with a bad password: %v, want unavailable", errs)
	}
	perr := p.Probe(testCtx(t))
	if !outbox.IsUnavailable(perr) {
		t.Fatalf("Probe with a bad password: %v, want unavailable", perr)
	}
	for _, err := range []error{errs[0], perr} {
		if strings.Contains(err.Error(), pw) || !strings.Contains(err.Error(), "xxxxx") {
			t.Errorf("error %q: want the broker named with its password redacted", err)
		}
		t.Log(err)
	}
}

// TestConcurrentPublish: several goroutines publishing at once each get
// their own confirmations and returns (run with -race).
func TestConcurrentPublish(t *testing.T) {
	t.Parallel()
	p, b := setup(t, rabbittest.URL(), outboxamqp.Config{}, "outbox.order")
	const workers, perWorker = 8, 10
	ctx := testCtx(t)
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			for i := 0; i < perWorker; i++ {
				good, lost := event(fmt.Sprintf("w%d-%d", w, i), 1), event(fmt.Sprintf("w%d-%d", w, i), 1)
				lost.AggregateType = "lost"
				errs := p.Publish(ctx, []outbox.Message{good, lost})
				if _, unrouted := outbox.UnavailableRoute(errs[1]); len(errs) != 2 || errs[0] != nil || !unrouted {
					errc <- fmt.Errorf("worker %d: %v", w, errs)
					return
				}
			}
			errc <- nil
		}()
	}
	for w := 0; w < workers; w++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if n := len(b.read(t, workers*perWorker)); n != workers*perWorker {
		t.Fatalf("read %d", n)
	}
}

// TestCloseMakesUnavailable: after Close, Publish and Probe fail as
// unavailable.
func TestCloseMakesUnavailable(t *testing.T) {
	t.Parallel()
	p, _ := setup(t, rabbittest.URL(), outboxamqp.Config{}, "outbox.order")
	checkNil(t, p.Publish(testCtx(t), []outbox.Message{event("o-1", 1)}))
	p.Close()
	errs := p.Publish(testCtx(t), []outbox.Message{event("o-1", 2)})
	if len(errs) != 1 || !outbox.IsUnavailable(errs[0]) {
		t.Fatalf("Publish after Close: %v", errs)
	}
	if err := p.Probe(testCtx(t)); !outbox.IsUnavailable(err) {
		t.Fatalf("Probe after Close: %v", err)
	}
}

// TestCanceledContext: a canceled context fails the messages without
// marking them unavailable or permanent.
func TestCanceledContext(t *testing.T) {
	t.Parallel()
	p, _ := setup(t, rabbittest.URL(), outboxamqp.Config{}, "outbox.order")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := p.Publish(ctx, []outbox.Message{event("o-1", 1)})
	if len(errs) != 1 || !errors.Is(errs[0], context.Canceled) || outbox.IsUnavailable(errs[0]) || outbox.IsPermanent(errs[0]) {
		t.Fatalf("Publish with a canceled context: %v", errs)
	}
}

// TestCloseLeavesNoGoroutines: after publishing (with a returned message
// and a channel abandoned by a canceled call), probing and Close, the
// publisher's goroutines are gone. Not parallel: it counts goroutines.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		p, err := outboxamqp.NewPublisher(outboxamqp.Config{URL: rabbittest.URL(), Exchange: rabbittest.UniqueName("outboxtest-x")})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		ctx := testCtx(t)
		if err := p.Probe(ctx); err != nil {
			t.Fatal(err)
		}
		lost := event("o-1", 1)
		lost.AggregateType = "lost"
		if errs := p.Publish(ctx, []outbox.Message{lost}); len(errs) != 1 || !outbox.IsUnavailable(errs[0]) {
			t.Fatalf("Publish: %v", errs)
		}
		short, cancel := context.WithTimeout(ctx, time.Microsecond)
		defer cancel()
		<-short.Done()
		_ = p.Publish(short, []outbox.Message{lost})
		var wg sync.WaitGroup
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = p.Publish(ctx, []outbox.Message{lost})
			}()
		}
		wg.Wait()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond) // goroutines end on their own; nothing signals it
	}
}
