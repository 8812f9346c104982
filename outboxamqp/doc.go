// Package outboxamqp is the RabbitMQ (AMQP 0-9-1) destination of the outbox:
// a [Publisher] that the relay hands claimed events to, and [Decode] for
// consumers that read them back. It is built on
// github.com/rabbitmq/amqp091-go. Use it from Go with outbox.NewRelay, or
// run "outbox relay --destination amqp://user@host:5672/vhost" (and "outbox
// replay" likewise). "outbox demo --destination amqp" runs the example order
// system on the machine's RabbitMQ and "outbox chaos --destination amqp" on a
// node of its own, which it restarts as a fault; the example consumer
// ("orders inventory --destination amqp://...") reads a queue bound to the
// exchange.
//
// # Destination URL
//
// [ParseURL] reads the URL form "outbox relay --destination" takes:
//
//	amqp://user:password@host:5672/vhost?exchange=outbox&routing_key=outbox.{aggregate_type}&source=/shop&confirm_timeout=10s&dial_timeout=5s&max_message_bytes=16777216&declare=true
//
// amqps:// connects with TLS (port 5671 by default), verified against the
// system's roots or ca_file's (PEM), with a client certificate when
// cert_file and key_file name one; the files are read by ParseURL (and
// NewPublisher), and a failed handshake is unavailable. User, host, port and
// virtual host follow amqp091's URI rules ("/" or no path is the vhost "/";
// guest:guest when no user is named). Keep the password out of command
// lines: name the user without one (amqp://relay@host/) and set
// OUTBOX_AMQP_PASSWORD; ParseURL takes it from there. The password is never
// printed: errors and Config's String and GoString redact it. Each query
// parameter is optional and sets the [Config] field of its name
// (declare=false sets Config.NoDeclare); unknown parameters are refused.
//
// # Exchange and routing keys
//
// Every message is published to one exchange, Config.Exchange ("outbox" by
// default), which the publisher declares as a durable topic exchange on each
// connection unless Config.NoDeclare (then it must exist; a missing exchange
// makes Probe fail and Publish fail as unavailable). The routing key comes
// from Config.RoutingKey, default "outbox.{aggregate_type}", where
// "{aggregate_type}" and "{aggregate_id}" are replaced by the event's (see
// [RoutingKey]); bind queues with keys such as "outbox.order" or
// "outbox.#". The publisher declares no queues: what is stored, and where,
// is the bindings' business. Bind the queues before the relay publishes: a
// message no queue is bound for fails as its routing key being unavailable
// (see below), and the relay holds it, quarantining nothing, until a queue
// is bound. A deleted exchange is not declared again while the
// connection lasts (its bindings went with it): publishing fails as
// unavailable until it is back.
//
// # Message format
//
// Messages are CloudEvents 1.0 in the AMQP binding's binary content mode:
// the body is the event's payload, the content-type property is its content
// type (application/json unless the event has another), and the attributes
// are application properties (headers) with string values:
// cloudEvents:specversion "1.0", cloudEvents:id (event id), cloudEvents:type
// (event type), cloudEvents:source (Config.Source), cloudEvents:subject
// (aggregate id), cloudEvents:time (occurred_at, RFC 3339 UTC with
// nanoseconds), and the extensions cloudEvents:aggregatetype,
// cloudEvents:sequence (aggregate_sequence as 20 zero-padded digits, so it
// sorts as text) and cloudEvents:schemaversion, plus cloudEvents:skippedfrom
// when events just before this one were skipped by an operator and
// cloudEvents:replayid on a replayed event (see outbox.Message). These are
// the attributes and names outboxnats and outboxkafka use, with the AMQP
// binding's "cloudEvents:" prefix. The event's own headers, such as
// traceparent, are plain application properties; they never set a
// cloudEvents: (or cloudEvents_) property, nor CC or BCC, which RabbitMQ
// would take as extra routing keys: such headers are dropped.
//
// The AMQP properties carry the rest: message-id is the event id (the key
// consumers and plugins deduplicate by), delivery-mode is 2 (persistent),
// type is the event type and timestamp is occurred_at (in seconds). A
// replayed event (outbox.Message.ReplayID set) keeps the event id as its
// message-id, so that consumers' inboxes drop what they already applied; it
// is told apart by its cloudEvents:replayid property. [Decode] turns a
// delivery back into exactly the Message published and refuses one with a
// missing or malformed attribute.
//
// # Delivery and errors
//
// Publish sends a batch on a channel in publisher-confirm mode, each
// message with the mandatory flag, and returns once every message was
// confirmed, Config.ConfirmTimeout passed or the context ended. A message
// the broker confirmed was routed to every queue bound for it and, for
// durable queues, written to disk. A message no queue is bound for comes
// back as a basic.return (before its confirmation) and fails alone as
// outbox.RouteUnavailable, the route being its routing key: nothing is wrong
// with the message, the binding is missing, and the relay holds the events
// of that routing key (no attempt spent, never quarantined) and probes it
// until a queue is bound; the rest of the batch is unaffected. A message
// over Config.MaxMessageBytes (16 MiB by default; RabbitMQ refuses messages
// over its max_message_size, 128 MiB by default, by closing the channel,
// which would fail the whole batch) or with a routing key over 255 bytes
// fails as outbox.Permanent before it is sent. A nack (a queue refusing
// with overflow=reject-publish, an internal error of a queue) concerns the
// queues bound for the routing key, not the message: outbox.RouteUnavailable
// too. When the broker cannot be reached, the connection is lost before
// the confirmation, no confirmation comes within ConfirmTimeout, the broker
// blocked the connection (a memory or disk alarm), the exchange is missing
// or access is refused, the messages not confirmed fail as
// outbox.Unavailable: the relay backs off without spending their attempts.
// Publish does not retry (the relay owns retries); the next Publish or
// Probe reconnects. Messages confirmed twice (the relay publishes again
// after a lost confirmation) are stored twice: consumers drop the copy by
// message-id (the inbox does).
//
// # Durability
//
// What a confirm is worth depends on the queues the message was routed to:
// fsynced by a majority of a quorum queue's replicas, fsynced on a durable
// classic queue's node, replicated but not fsynced in a stream, in memory in
// a transient queue. AMQP 0-9-1 shows neither bindings nor queue types:
// [Publisher.CheckDurability] (outbox.DurabilityChecker, called by the relay
// at start) inspects the queues named in Config.CheckQueues (check_queues in
// the URL) by declaring them again and reading the broker's refusal. See
// docs/destinations.md, "What an acknowledgement is worth".
//
// # Order
//
// Within one channel RabbitMQ routes messages in the order they were
// published, but a publisher cannot make the broker refuse an out-of-order
// message: an append is never conditional. So the order guarantee comes
// from the relay, not from pipelining: it publishes an aggregate's event
// k+1 only after k was confirmed, and never puts two events of one
// aggregate in one call. A queue then holds each aggregate's events in
// sequence order; a consumer that needs order reads it with one consumer
// (or a single active consumer), and the inbox's per-aggregate high-water
// mark catches what redelivery reorders.
//
// # Concurrency
//
// A Publisher holds one connection and a small pool of channels; each
// Publish uses a channel of its own, so confirmations and returns are never
// mixed up between concurrent calls. A channel whose confirmations were not
// all received (ctx ended) is closed, not reused.
package outboxamqp
