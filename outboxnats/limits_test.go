package outboxnats_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// TestOverlongSubjectIsPermanentForItsMessageOnly is the regression test of
// issue 8, item 1: an aggregate id of 1,500 bytes, percent-encoded into the
// subject, passed the server's 4,096-byte control line; the server closed
// the connection, every message in flight failed as unavailable, and the same
// event came back first after each reconnect. Now that message alone fails,
// as permanent, before it is sent, and the connection stays up.
func TestOverlongSubjectIsPermanentForItsMessageOnly(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		ctx := testCtx(t)
		p := natstest.Publisher(t, js, outboxnats.Config{})
		long := event(strings.Repeat("é", 750), 1) // 1,500 bytes, 4,500 percent-encoded
		msgs := []outbox.Message{event("o-1", 1), long, event("o-2", 1)}
		errs := p.Publish(ctx, msgs)
		if len(errs) != 3 || errs[0] != nil || errs[2] != nil {
			t.Fatalf("Publish errors %v: want only the long one to fail", errs)
		}
		if !outbox.IsPermanent(errs[1]) || outbox.IsUnavailable(errs[1]) {
			t.Fatalf("overlong subject: %v, want a permanent error", errs[1])
		}
		if st := js.Conn().Status(); st != nats.CONNECTED {
			t.Fatalf("connection is %s after the overlong message, want CONNECTED", st)
		}
		checkNil(t, p.Publish(ctx, []outbox.Message{event("o-3", 1)}))
		if n := streamInfo(t, js, p.Stream()).State.Msgs; n != 3 {
			t.Fatalf("stream has %d messages, want 3", n)
		}

		// The writer's limits, percent-encoded at their worst, still fit.
		edge := event(strings.Repeat("\x7e", outbox.MaxAggregateIDBytes), 1)
		edge.AggregateType = strings.Repeat("~", outbox.MaxNameBytes)
		if n := len(outboxnats.Subject(strings.Repeat("p", outboxnats.MaxSubjectPrefixBytes), edge.AggregateType, edge.AggregateID)); n > outboxnats.MaxSubjectBytes {
			t.Fatalf("a subject within the writer's limits is %d bytes, over MaxSubjectBytes %d", n, outboxnats.MaxSubjectBytes)
		}
		checkNil(t, p.Publish(ctx, []outbox.Message{edge}))
	})
}

// TestSubjectPrefixLimit: a prefix that would leave no room for the
// aggregate's tokens is refused when the publisher is built.
func TestSubjectPrefixLimit(t *testing.T) {
	t.Parallel()
	js := natstest.JetStream(t, natstest.Conn(t))
	_, err := outboxnats.NewPublisher(testCtx(t), js, outboxnats.Config{Stream: "S_prefix_limit",
		SubjectPrefix: strings.Repeat("p", outboxnats.MaxSubjectPrefixBytes+1)})
	if err == nil || !strings.Contains(err.Error(), "subject prefix") {
		t.Fatalf("NewPublisher with an overlong prefix: %v, want a clear error", err)
	}
}

// TestContentTypeRoundTrip: a message's content type travels as the
// CloudEvents datacontenttype (content-type in binary mode) and comes back
// from Decode, and a payload that is not JSON arrives byte for byte.
func TestContentTypeRoundTrip(t *testing.T) {
	t.Parallel()
	js := natstest.JetStream(t, natstest.Conn(t))
	ctx := testCtx(t)
	p := natstest.Publisher(t, js, outboxnats.Config{})
	proto := event("o-1", 1)
	proto.ContentType = "application/x-protobuf; messageType=\"shop.OrderCreated\""
	proto.Payload = []byte{0x0a, 0x03, 'o', '-', '1', 0x10, 0x00, 0xff}
	empty := event("o-2", 1)
	empty.ContentType = "application/octet-stream"
	empty.Payload = nil
	msgs := []outbox.Message{proto, empty, event("o-3", 1)}
	checkNil(t, p.Publish(ctx, msgs))
	for i, d := range readAll(t, js, p.Stream(), len(msgs)) {
		got, err := outboxnats.Decode(d.Headers(), d.Data())
		if err != nil {
			t.Fatal(err)
		}
		want := msgs[i]
		want.Attempt = 0
		if got.ContentType != want.ContentType || string(got.Payload) != string(want.Payload) {
			t.Errorf("message %d: content type %q payload %x, want %q %x", i, got.ContentType, got.Payload, want.ContentType, want.Payload)
		}
	}
}
