package destinationtest

import (
	"context"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
)

// AggregateTypes are the only aggregate types the suite's messages have.
var AggregateTypes = []string{"order", "payment"}

// Destination describes a destination under test.
type Destination struct {
	// Open prepares a namespace of the test's own at the destination (a
	// stream, a topic, an exchange and queue, a receiver) and returns the
	// target in it. The suite calls it once per check; release what it made
	// with t.Cleanup. Required.
	Open func(t *testing.T) Target
	// OpenRestartable is Open on a broker of the test's own, with
	// Target.Restart set, for the Restart check. Nil when the destination
	// cannot be restarted here (the check is then left out and the test log
	// says so).
	OpenRestartable func(t *testing.T) Target
	// AttributePrefix is the prefix of the CloudEvents attributes in the
	// protocol's binding as Delivery.Attributes names them: "ce_" for
	// Kafka, "cloudEvents:" for AMQP, "ce-" for HTTP and NATS.
	AttributePrefix string
	// DedupKey reports whether the destination carries a dedup or
	// idempotency key (Nats-Msg-Id, the AMQP message-id, Idempotency-Key):
	// then Delivery.Key must be the event id.
	DedupKey bool
}

// Target is one namespace at the destination under test.
type Target struct {
	// Publisher publishes into the namespace. Required.
	Publisher outbox.Publisher
	// Read returns every message now at the destination in the namespace,
	// in the destination's order (for each aggregate, the order a consumer
	// receives them), read with a client independent of Publisher and
	// decoded with the destination's Decode. It waits until at least n
	// messages are there and returns all of them; when ctx ends first, it
	// returns those it read and ctx's error. Required.
	Read func(ctx context.Context, n int) ([]Delivery, error)
	// Unreachable returns a publisher for the same namespace that cannot
	// reach the destination (its address has nothing listening, or its
	// server was shut down). Required.
	Unreachable func(t *testing.T) outbox.Publisher
	// Refuse returns msg changed so that the destination can never accept
	// it (too large, refused by the endpoint), keeping its id. The refusal
	// must depend on the message: a route the destination lacks is Unroute's.
	// Required.
	Refuse func(msg outbox.Message) outbox.Message
	// RefuseAtDestination returns msg changed so that the publisher sends
	// it and the destination refuses it (a Kafka record over the topic's
	// max.message.bytes that the client's own limit allows), keeping its id.
	// Nil when a message the destination cannot take is always refused
	// before it is sent. Optional.
	RefuseAtDestination func(msg outbox.Message) outbox.Message
	// Unroute returns msg changed so that it goes by a route the
	// destination does not have (a routing key no queue is bound for, a
	// topic that does not exist), keeping its id. Nil when every message
	// goes the same way. Optional.
	Unroute func(msg outbox.Message) outbox.Message
	// Restart stops the broker and starts it again with its data, and
	// returns once it accepts connections. Set by OpenRestartable only.
	Restart func(t *testing.T)
}

// Delivery is one message as read back from the destination.
type Delivery struct {
	// Message is what the destination's Decode returned.
	Message outbox.Message
	// Attributes are the protocol's headers or properties as carried, by
	// name (CloudEvents attributes under Destination.AttributePrefix).
	Attributes map[string]string
	// Key is the dedup or idempotency key the destination carried, "" when
	// it has none.
	Key string
}

// Run runs every check of the suite on d, each as a subtest.
func Run(t *testing.T, d Destination) {
	t.Helper()
	if d.Open == nil {
		t.Fatal("destinationtest: Destination.Open is required")
	}
	t.Run("RoundTrip", func(t *testing.T) { roundTrip(t, d) })
	t.Run("Replay", func(t *testing.T) { replay(t, d) })
	t.Run("OrderAcrossRetries", func(t *testing.T) { orderAcrossRetries(t, d) })
	t.Run("Unavailable", func(t *testing.T) { unavailable(t, d) })
	t.Run("PermanentAlone", func(t *testing.T) {
		permanentAlone(t, d, func(tg Target) func(outbox.Message) outbox.Message { return tg.Refuse })
	})
	tg := open(t, d.Open)
	if tg.RefuseAtDestination != nil {
		t.Run("RefusedAtDestinationAlone", func(t *testing.T) {
			permanentAlone(t, d, func(tg Target) func(outbox.Message) outbox.Message { return tg.RefuseAtDestination })
		})
	} else {
		t.Log("destinationtest: no RefuseAtDestination: the RefusedAtDestinationAlone check is left out")
	}
	if tg.Unroute != nil {
		t.Run("RouteRefused", func(t *testing.T) { routeRefused(t, d) })
	} else {
		t.Log("destinationtest: no Unroute: the RouteRefused check is left out")
	}
	if op, ok := tg.Publisher.(outbox.OrderedPipeliner); ok && op.OrderedPipelining() {
		t.Run("Pipelining", func(t *testing.T) {
			pipelining(t, d, func(tg Target) func(outbox.Message) outbox.Message { return tg.Refuse })
		})
		if tg.RefuseAtDestination != nil {
			t.Run("PipeliningRefusedAtDestination", func(t *testing.T) {
				pipelining(t, d, func(tg Target) func(outbox.Message) outbox.Message { return tg.RefuseAtDestination })
			})
		}
	} else {
		t.Log("destinationtest: the publisher does not declare ordered pipelining: the Pipelining check is left out")
	}
	if d.OpenRestartable == nil {
		t.Log("destinationtest: no OpenRestartable: the Restart check is left out")
	} else {
		t.Run("Restart", func(t *testing.T) { restart(t, d) })
	}
}

// open opens a target and checks it is complete.
func open(t *testing.T, opener func(*testing.T) Target) Target {
	t.Helper()
	tg := opener(t)
	if tg.Publisher == nil || tg.Read == nil || tg.Unreachable == nil || tg.Refuse == nil {
		t.Fatal("destinationtest: Target needs Publisher, Read, Unreachable and Refuse")
	}
	return tg
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
