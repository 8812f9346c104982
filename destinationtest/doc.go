// Package destinationtest is the conformance suite of outbox destinations:
// the checks every [outbox.Publisher] that ships with outbox passes (NATS
// JetStream, Kafka, RabbitMQ, HTTP webhooks), written so that the author of
// another destination can run them on theirs.
//
// A test describes its destination with a [Destination] (how to open a
// namespace of the test's own there, read it back with an independent
// client, make it unreachable, make a message it can never accept, and
// restart it) and calls [Run]:
//
//	func TestConformance(t *testing.T) {
//		destinationtest.Run(t, destinationtest.Destination{
//			AttributePrefix: "ce_",
//			Open:            openMyDestination,
//		})
//	}
//
// # What it checks
//
//   - RoundTrip: every message Publish reported as succeeded is at the
//     destination, read back with an independent client, and the
//     destination's Decode returns the Message that was published: id,
//     aggregate, sequence, type, schema version, content type, payload,
//     headers, occurred-at, SkippedFrom and replay id. The CloudEvents
//     attributes are there in the protocol's binding (specversion, id,
//     source, type under AttributePrefix), and the event id is the
//     destination's dedup or idempotency key where it has one.
//   - Replay: a replayed copy (Message.ReplayID set) of a message already
//     published reaches the destination too, even where the destination
//     deduplicates by key.
//   - OrderAcrossRetries: a real relay over a PostgreSQL schema of the
//     test's own publishes interleaved aggregates through the destination
//     while failures are injected (a message refused before it is sent, and
//     a message sent whose acknowledgement is lost); read back, each
//     aggregate's events appear for the first time in sequence order, and
//     none is missing.
//   - Unavailable: a destination that cannot be reached fails every
//     message with an error marked [outbox.Unavailable] (the relay spends no
//     attempt on it), and Probe, where the publisher is an [outbox.Prober],
//     says so too.
//   - PermanentAlone: a message the destination can never accept fails as
//     [outbox.Permanent], alone: the other messages of its call succeed.
//   - RefusedAtDestinationAlone (when Target.RefuseAtDestination is set): the
//     same for a message the client sends and the destination itself
//     refuses (a Kafka record over the topic's max.message.bytes), where the
//     protocol may fail its neighbours with the same error: they must still
//     succeed.
//   - RouteRefused (when Target.Unroute is set): a message for a route the
//     destination does not have (no queue bound for its routing key, a
//     topic that does not exist) fails, alone, as that route being
//     unavailable ([outbox.RouteUnavailable]), never as permanent: a refusal
//     that does not depend on the message must not quarantine it.
//   - Restart (when the destination can be restarted here): the broker is
//     stopped and started again while batches are being published; every
//     message that was reported as succeeded is there afterwards, and none
//     failed as permanent.
//   - Pipelining (when the publisher declares [outbox.OrderedPipeliner]):
//     in one call holding two aggregates' runs of events, a refused message
//     in the middle of a run fails, the run's later messages fail too and
//     are not at the destination, and the rest arrive in sequence order;
//     with RefuseAtDestination, also for a message the destination refuses.
//     OrderAcrossRetries then also runs pipelined.
//
// The suite uses PostgreSQL (DATABASE_URL, default
// postgres://postgres@127.0.0.1:5432/postgres) for the relay check, and the
// aggregate types in [AggregateTypes] only, so a destination that needs a
// topic or binding per aggregate type can prepare them in Open.
package destinationtest
