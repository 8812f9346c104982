// Package outboxnats is the NATS JetStream destination of the outbox: a
// [Publisher] that the relay hands claimed events to, and [Decode] for
// consumers that read them back.
//
// # Stream and subjects
//
// [NewPublisher] creates one stream (file storage, a deduplication window)
// that captures "<prefix>.>", or checks that an existing stream of that name
// captures it. Each event goes to its aggregate's subject
//
//	<prefix>.<aggregate type token>.<aggregate id token>
//
// for example "outbox.order.o-42" (see [Subject]). A token is the string
// with every byte outside [A-Za-z0-9_-] written as %XX and the empty string
// written as "%", so "a.b" becomes "a%2Eb" and an id full of dots,
// wildcards, spaces or unicode is still exactly one token. Different
// aggregates never share a subject, and [ParseSubject] inverts the mapping.
// Several systems (or test runs) share one server by using different stream
// names and prefixes.
//
// # Destination URL and TLS
//
// [ParseURL] reads the URL "outbox relay --destination" takes,
// nats://host:4222?stream=OUTBOX&subject_prefix=outbox&..., into the
// server to connect to and a [Config]. tls:// connects with TLS; ca_file,
// cert_file and key_file (PEM) name the CAs that sign the server's
// certificate and a client certificate, are read by ParseURL, and become
// nats.Connect options through [Config.ConnectOptions], since the
// publisher uses the connection it is given:
//
//	server, cfg, err := outboxnats.ParseURL("tls://relay@nats:4222?ca_file=/etc/ca.pem&cert_file=/etc/relay.pem&key_file=/etc/relay.key")
//	opts, err := cfg.ConnectOptions()
//	nc, err := nats.Connect(server, opts...)
//
// # Message format
//
// Messages are CloudEvents 1.0 in binary content mode: the data is the
// event's payload (content-type: application/json) and the attributes are
// headers: ce-specversion "1.0", ce-id (event id), ce-type (event type),
// ce-source (Config.Source), ce-subject (aggregate id), ce-time (occurred_at,
// RFC 3339 UTC), and the extensions ce-aggregatetype, ce-sequence
// (aggregate_sequence as 20 zero-padded digits, so it sorts as text),
// ce-schemaversion and ce-partitionkey (aggregate id), plus ce-skippedfrom
// when events just before this one were skipped by an operator and
// ce-replayid on a replayed event (see outbox.Message). String attributes are
// percent-encoded as in the CloudEvents HTTP binding (space, '"', '%' and
// bytes outside printable ASCII become %XX; plain ids are unchanged), since
// NATS header values are ASCII lines. The event's own headers, such as the
// W3C traceparent and tracestate, are copied as they are, except that they
// never override ce-, content-type or Nats- headers. Nats-Msg-Id is the event
// id, so the stream drops a republished event within its duplicate window
// (the publisher reports that as success); a replayed event's Nats-Msg-Id is
// "<event id>:<replay id>", so a replay is stored however recent the
// original publish.
//
// # Delivery and errors
//
// Publish sends a batch asynchronously, at most Config.MaxPending messages
// in flight, and returns once every message has been acknowledged by the
// stream, failed or its context ended; it never retries (the relay does).
// Failures are classified for the relay: outbox.Unavailable when the server
// cannot be reached or cannot store anything (connection closed or
// reconnecting, no stream on the subject, no acknowledgement within
// Config.AckTimeout or the context's deadline, JetStream unavailable or out
// of storage), outbox.Permanent when this message can never be accepted
// (larger than the server's max payload or the stream's max message size, an
// invalid header name); anything else is a plain, retryable error.
//
// # Consuming in parallel, in order per aggregate
//
// JetStream keeps the messages of one subject in the order they were stored,
// and the relay publishes an aggregate's event k+1 only after k was
// acknowledged, so the stream holds each aggregate's events in sequence
// order. Different aggregates are independent, which lets consumers scale
// out:
//
//   - Filter by aggregate type: a durable consumer with FilterSubject
//     [AggregateTypeFilter](prefix, "order") ("<prefix>.order.>") sees only
//     orders; another one, only payments. Each consumer of the stream gets
//     every event once (at least once, to be exact).
//   - Within one consumer, process different subjects concurrently but one
//     subject at a time: for example several pull consumers each filtering
//     a share of the aggregates (a subject-mapping partition of the id
//     token, or filters on ranges of aggregates), or one consumer whose
//     workers are chosen by a hash of the message subject (ce-partitionkey),
//     each worker handling its messages in order.
//   - Per-aggregate order holds on one subject, but redelivery (a nak, an
//     ack timeout, a crashed worker) can bring k back after k+1 was
//     delivered. The consumer's inbox therefore enforces order anyway: it
//     records the last applied sequence per aggregate in the same
//     transaction as the effect, skips sequences at or below it
//     (duplicates) and does not apply a sequence beyond the next one (a
//     gap): it naks that message with a delay, so that it comes back after
//     the missing one.
//
// [Decode] turns a delivered message back into an outbox.Message.
//
// # Durability
//
// A PubAck means the stream stored the message, not that it is on disk: a
// server fsyncs its file streams every sync_interval (two minutes by
// default). [Publisher.CheckDurability] (outbox.DurabilityChecker, called by
// the relay at start) reports whether an acknowledged message survives the
// loss of the server: a file stream with two or more replicas, or one
// replica on a server that fsyncs every write (sync_interval: always), which
// it can only see through the server's monitoring endpoint
// (Config.MonitorURL, monitor_url in the URL). See docs/destinations.md,
// "What an acknowledgement is worth".
//
// # Embedded server
//
// [StartEmbedded] runs a NATS server with JetStream inside the process (for
// tests, demos and single-binary setups), fsyncing every write before
// acknowledging it and serving HTTP monitoring on a free port
// ([Embedded.MonitorURL]); [StartEmbeddedWith] takes other settings. The
// internal natstest package wraps it and the real server for tests.
package outboxnats
