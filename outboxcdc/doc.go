// Package outboxcdc is a change-data-capture relay: it reads the outbox
// table's committed inserts from PostgreSQL's write-ahead log through logical
// replication and publishes them at once, instead of waiting for a poll.
//
// # How it works
//
// Setup creates a publication of the outbox table's inserts only and a
// permanent logical replication slot per relay group (pgoutput plugin).
// Relay.Run streams the slot from its confirmed position. A reader
// goroutine reads the replication connection, collects the event ids of
// each committed transaction in commit order, queues them, answers the
// server and confirms the slot; a publisher goroutine beside it hands the
// queued ids, a batch at a time, to outbox.Relay.PublishIDs: the polling
// relay's claim, lease, publish and fenced settle, restricted to those ids.
// The reader never waits for a publish, so a slow batch cannot bring the
// server's wal_sender_timeout. Memory is bounded (Config.MaxQueued): past
// it the reader reads on without queueing, and reads the rest again from
// the slot once the queue is done. Only when every id of a transaction is
// finished, and the marks of the calls that published them are written,
// is the slot confirmed past it (confirmed_flush_lsn), so a relay that
// stops or dies anywhere before reads those transactions again on restart;
// events already published are then found published and left.
//
// # The table stays the truth
//
// The WAL is only a feed of candidate ids. PublishIDs publishes an event only
// when it is claimable and the head of its aggregate's lane (or the head's
// contiguous successor among the ids). An id it does not publish and the
// table shows pending (behind an unpublished event of its aggregate, leased
// by another relay, backing off) waits in the stream and is handed over
// again as soon as its predecessor may be published, for up to
// Config.WaitLimit; the slot is not confirmed past it meanwhile. What the
// stream leaves (quarantined or parked, blocked past the limit, never found)
// goes to the polling path. A polling relay with
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
// the same group stands by: it looks at pg_replication_slots every
// Config.StandbyInterval, without failing anything in the server's log,
// and starts streaming once the slot is free. Whoever starts streaming
// first receives what PostgreSQL decodes again from the slot's restart_lsn
// (see SlotStatus.RedecodeBytes). A slot PostgreSQL invalidated (it needed
// WAL past max_slot_wal_keep_size) is dropped and created again at the
// current position; the events committed in the gap are published by the
// safety net from the table.
//
// # Requirements
//
// wal_level = logical, a free replication slot and WAL sender
// (max_replication_slots, max_wal_senders), and a role with REPLICATION that
// may create a publication on the outbox table. docs/operations.md,
// "Operating CDC", covers settings, monitoring and recovery.
package outboxcdc
