// Package outbox is a transactional outbox for PostgreSQL: it records the
// intent to publish an event in the same local transaction as the business
// change it describes, and relays committed events to a broker at least once,
// in order per aggregate.
//
// # Writing events
//
// A Writer records events inside the caller's transaction, pgx
// ([Writer.InsertTx]) or database/sql ([Writer.InsertSQLTx]). Each event gets
// a UUIDv7 id and the next aggregate_sequence of its aggregate. The events
// exist if and only if the transaction commits:
//
//	tx, _ := pool.Begin(ctx)
//	_, _ = tx.Exec(ctx, `INSERT INTO orders ...`)
//	_, err := writer.InsertTx(ctx, tx, outbox.Event{
//		AggregateType: "order", AggregateID: orderID,
//		Type: "OrderCreated", Payload: payload,
//	})
//	// handle err, then
//	err = tx.Commit(ctx)
//	notifier.Notify() // optional: wake the relays now (an outbox.Notifier, non-blocking)
//
// # Relaying events
//
// A [Relay] claims committed events in short transactions with
// FOR UPDATE SKIP LOCKED and a lease, publishes them outside any transaction,
// and marks them published only after the destination acknowledged. A crash
// in between republishes: delivery is at-least-once, and the event id stays
// the same, so consumers deduplicate (see package inbox). Every write-back is
// fenced by the claim's token, so a relay that stalled past its lease cannot
// overwrite the relay that took its events over.
//
// Per aggregate, events are published strictly in sequence order: a relay
// claims the head of an aggregate's lane with its contiguous successors and
// publishes them one after the other (see [Relay]). Failed publishes
// back off exponentially through available_at; an event that fails
// permanently or too often is quarantined and holds its aggregate's later
// events behind it, visibly.
//
// # Destinations
//
// A destination implements [Publisher]. Package outboxnats publishes to NATS
// JetStream with CloudEvents headers.
//
// # Operations
//
// [Admin] is the operator's API (`outbox status`, `outbox quarantine`,
// `outbox replay` and `outbox cleanup` wrap it): [Admin.Status] says whether
// the outbox is healthy and what is stuck, [Admin.ListQuarantined] why;
// [Admin.Retry] puts a quarantined event back in its lane and [Admin.Skip]
// settles it unpublished with a recorded reason, unblocking its aggregate
// (the next event carries [Message.SkippedFrom]); [Admin.Replay] publishes
// history again with the original ids; [Admin.Cleanup] (or the relay,
// periodically, see [RelayConfig].Cleanup) deletes settled events past the
// replay horizon in bounded batches.
//
// # Metrics
//
// The relay reports its work to [RelayConfig].Observer, any value
// implementing one or more of [ClaimObserver], [PublishObserver],
// [SettleObserver], [CleanupObserver] and [DurabilityObserver] (what the
// destination's acknowledgement is worth, checked at start through a
// [DurabilityChecker]); [Relay.Ready] backs a readiness probe. Package outboxprom turns these into Prometheus metrics, so this
// package depends on no metrics library.
//
// # Tracing
//
// The writer copies the W3C trace context of the ctx given to
// [Writer.InsertTx] into each event's headers ("traceparent",
// "tracestate"), unless [WriterConfig].DisableTraceContext is set or the
// event has a traceparent of its own. The relay publishes each event in an
// OpenTelemetry PRODUCER span, a child of that context, from
// [RelayConfig].TracerProvider (the global provider when nil, a no-op
// unless the application set one), and sends the span's context on as the
// message's traceparent; package inbox and the webhook Receiver continue
// the trace in a CONSUMER span. Nothing global is set. See
// docs/operations.md, "Tracing".
//
// # Schema
//
// Package outboxmigrate creates the tables in a configurable schema ("outbox"
// by default); `outbox migrate` does the same from the command line
// (`--only consumer` for a consumer's own database). Give every component
// the same schema with one [Schema] value, in its config's Tables field;
// the older Schema string fields still work, and a config naming two
// different schemas is refused ([ErrSchemaConflict]).
package outbox
