// Package outboxkafka is the Kafka destination of the outbox: a [Publisher]
// that the relay hands claimed events to, and [Decode] for consumers that
// read them back. It is built on franz-go (kgo). Use it from Go with
// outbox.NewRelay, or run "outbox relay --destination kafka://host:port"
// (and "outbox replay" likewise); "outbox demo" and "outbox chaos" run the
// example order system on it with --destination kafka.
//
// # Destination URL
//
// [ParseURL] reads the URL form "outbox relay --destination" takes:
//
//	kafka://host1:9092,host2:9092?topic=outbox.{aggregate_type}&source=/shop&delivery_timeout=10s&dial_timeout=5s&max_record_bytes=1000000
//	kafka://relay@host1:9092,host2:9092?sasl=scram-sha-512&tls=true&ca_file=/etc/kafka/ca.pem&cert_file=/etc/relay.pem&key_file=/etc/relay.key
//
// The host part lists the seed brokers (port 9092 when left out); each query
// parameter is optional and sets the Config field of its name.
//
// A user before the brokers authenticates with SASL, and sasl= names the
// mechanism (plain, scram-sha-256 or scram-sha-512; required with a user,
// refused without one). The password is taken from the environment
// variable OUTBOX_KAFKA_PASSWORD ([PasswordEnv]), so that it appears in no
// command line; "user:password@" (percent-encoded) is accepted too, and
// wins. The password is never printed: errors and Config's String and
// GoString leave it out. tls=true dials the brokers with TLS, checking their
// certificates against the system's roots, or the PEM ca_file's, and their
// host names; cert_file and key_file (PEM, both or neither) are a client
// certificate for brokers that require one. A CA or certificate file implies
// tls=true. PLAIN sends the password as it is: use it with TLS. From Go, set
// the same [Config] fields (Config.TLSConfig for anything else TLS), or pass
// kgo options to [NewPublisher] (another SASL mechanism, such as OAUTHBEARER
// or AWS_MSK_IAM).
//
// A failed authentication or TLS handshake (a wrong password, a broker
// certificate from an unknown authority, no client certificate where one is
// required) is outbox.Unavailable, for Publish and Probe alike: no event can
// be published until the configuration or the cluster is fixed, so the relay
// waits and probes instead of quarantining events. Kafka answers a wrong
// password with SASL_AUTHENTICATION_FAILED, which Probe reports at once; a
// record that cannot be produced meanwhile fails when DeliveryTimeout
// passes.
//
// # Topics, keys and partitions
//
// Each event goes to the topic made from Config.Topic by replacing
// "{aggregate_type}" with its aggregate type (default
// "outbox.{aggregate_type}", so "outbox.order"); see [Topic]. Kafka topic
// names allow only [a-zA-Z0-9._-] and at most 249 characters: an aggregate
// type that cannot form a valid name fails its message as outbox.Permanent.
// The publisher does not create topics; create them beforehand (or pass
// kgo.AllowAutoTopicCreation to [NewPublisher] where the brokers allow it).
//
// The record key is the aggregate id and the partitioner hashes the key
// (kgo.StickyKeyPartitioner, the Java client's murmur2), so all events of an
// aggregate land on one partition. The publisher declares ordered
// pipelining (outbox.OrderedPipeliner): the relay hands it an aggregate's
// claimed events k, k+1, ... in one call, and they are produced in that
// order by the idempotent producer, which the broker holds to per-partition
// sequence numbers; when a record fails, the client fails every record
// buffered behind it in its partition, so a failed k is never followed by a
// stored k+1. Each partition therefore holds each aggregate's events in
// sequence order (first deliveries; a retried event may come again later),
// a busy aggregate does not wait for one acknowledgement per event, and
// consumers scale out by partition (a consumer group).
//
// # Record format
//
// Records are CloudEvents 1.0 in the Kafka binding's binary content mode: the
// value is the event's payload, content-type is its content type
// (application/json unless the event has another), and the attributes are
// headers with UTF-8 values: ce_specversion "1.0", ce_id (event id), ce_type
// (event type), ce_source (Config.Source), ce_subject (aggregate id),
// ce_time (occurred_at, RFC 3339 UTC with nanoseconds), and the extensions
// ce_aggregatetype, ce_sequence (aggregate_sequence as 20 zero-padded
// digits, so it sorts as text) and ce_schemaversion, plus ce_skippedfrom when
// events just before this one were skipped by an operator and ce_replayid on
// a replayed event (see outbox.Message). These are the attributes and names
// outboxnats uses, with the Kafka binding's "ce_" prefix. The event's own
// headers, such as traceparent, are plain record headers; they never override
// ce_ or content-type headers. [Decode] turns a record back into exactly the
// Message published and refuses one with a missing, repeated or malformed
// attribute.
//
// # Delivery and errors
//
// The producer uses acks=all and idempotent writes (franz-go's defaults, set
// explicitly; disabling idempotency is refused), so a record acknowledged is
// on every in-sync replica and a retry inside the client never duplicates or
// reorders records of a partition. Kafka has no deduplication by event id:
// a message the relay publishes again after an unacknowledged attempt may be
// stored twice, and consumers drop the copy by ce_id (the inbox does).
//
// Publish buffers a batch's records, then sends them (calls take turns), and
// returns once every record was acknowledged, failed, Config.DeliveryTimeout
// passed or the context ended; it does not retry beyond what the client does
// within DeliveryTimeout (the relay owns retries), except for one thing: the
// broker refuses a whole record batch over one record (or over its own size)
// and the client then fails every record buffered behind it in the partition
// with the same error, so Publish produces those records again alone, in
// order, and only a record refused alone fails. Failures are classified for
// the relay, by whether they depend on the message: outbox.Unavailable when
// the cluster cannot be reached or cannot store anything now (no broker
// answering, no acknowledgement in time, no partition leader, not enough
// in-sync replicas, the client closed, no authorization on the cluster),
// outbox.RouteUnavailable for the topic when the broker refuses the topic as
// a whole (it does not exist, no authorization for it: the relay holds its
// events, quarantining none), outbox.Permanent when this message can never
// be accepted (over Config.MaxRecordBytes, checked before sending so that it
// fails alone; refused by the broker when produced alone; an invalid topic
// name), and anything else is a plain, retryable error. [Publisher.Probe]
// sends one metadata request.
//
// # Durability
//
// An acknowledged record is on every in-sync replica, in memory: Kafka does
// not fsync each record by default and relies on replication.
// [Publisher.CheckDurability] (outbox.DurabilityChecker, called by the relay
// at start) reports whether every topic the template names has a
// replication factor and min.insync.replicas of at least 2 (or
// flush.messages=1), without unclean leader election. See
// docs/destinations.md, "What an acknowledgement is worth".
//
// # Tests
//
// No Kafka server runs where this package is developed: its tests and
// example run against kfake, the in-process Kafka-protocol cluster that ships
// with franz-go (github.com/twmb/franz-go/pkg/kfake), started by each test.
// The package itself uses only the Kafka protocol through kgo and nothing
// specific to kfake.
package outboxkafka
