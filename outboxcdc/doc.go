// Package outboxcdc is a change-data-capture relay: it reads the outbox
// table's committed inserts from PostgreSQL's write-ahead log through logical
// replication and publishes them at once, instead of waiting for a poll.
//
// # How it works
//
// Setup creates a publication of the outbox table's inserts only and a
// permanent logical replication slot per relay group (pgoutput plugin).
// Relay.Run streams the slot from its confirmed position, collects the
// event ids of each committed transaction in commit order, and hands them,
// a batch at a time, to outbox.Relay.PublishIDs: the polling relay's claim,
// lease, publish and fenced settle, restricted to those ids. Only when a
// batch's call returned does the stream confirm the end of its last
// transaction to PostgreSQL (the slot's confirmed_flush_lsn), so a relay
// that stops or dies anywhere before reads those transactions again on
// restart; events already published are then found published and left.
//
// # The table stays the truth
//
// The WAL is only a feed of candidate ids. PublishIDs publishes an event only
// when it is claimable and the head of its aggregate's lane (or the head's
// contiguous successor among the ids), and leaves the rest (leased by
// another relay, behind an unpublished or quarantined event, backing off,
// failed) to the polling path. A polling relay with
// outbox.RelayConfig.ReconcileAfter set runs beside the stream as its safety
// net (Config.SafetyNet, or `outbox relay --mode reconcile` elsewhere): it
// publishes what has been pending longer than the threshold, with the same
// leases and fencing, so the two paths cannot publish an aggregate's events
// out of order between them. docs/design.md, "Change-data capture", has
// the argument.
//
// # Standby and invalidation
//
// PostgreSQL lets one connection stream a slot at a time; a second relay of
// the same group stands by, retrying, and takes over when the first one's
// connection ends. A slot PostgreSQL invalidated (it needed WAL past
// max_slot_wal_keep_size) is dropped and created again at the current
// position; the events committed in the gap are published by the safety
// net from the table.
//
// # Requirements
//
// wal_level = logical, a free replication slot and WAL sender
// (max_replication_slots, max_wal_senders), and a role with REPLICATION that
// may create a publication on the outbox table. docs/operations.md,
// "Operating CDC", covers settings, monitoring and recovery.
package outboxcdc
