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
//	_ = writer.Notify(ctx, pool) // optional: wake the relays now
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
// only claims the head of an aggregate's lane (see [Relay]). Failed publishes
// back off exponentially through available_at; an event that fails
// permanently or too often is quarantined and holds its aggregate's later
// events behind it, visibly.
//
// # Destinations
//
// A destination implements [Publisher]. Package outboxnats publishes to NATS
// JetStream with CloudEvents headers.
//
// # Schema
//
// Package outboxmigrate creates the tables in a configurable schema ("outbox"
// by default); `outbox migrate` does the same from the command line.
package outbox
