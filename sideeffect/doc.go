// Package sideeffect makes a consumer's call to a system outside its
// database (a payment provider, a mailer) safe to retry: one call per event,
// made with the same idempotency key on every retry, its outcome recorded,
// and an ambiguous outcome (a timeout, a lost response) resolved by asking
// the provider rather than by guessing.
//
// The inbox (package inbox) makes a database effect happen once, because the
// effect and the inbox row commit in one transaction. An external call
// cannot join that transaction. A [Caller] therefore records each attempt in
// the side_effects table of the consumer's schema (created by
// outboxmigrate, migration 7), in transactions of its own:
//
//  1. before calling, the attempt is claimed: a row (name, key) in state
//     started, with the sha256 of the request and a lease;
//  2. the call is made with the key as its idempotency key;
//  3. its outcome is recorded under the claim's fence: succeeded or failed
//     with the response, or unknown when the call may or may not have taken
//     effect.
//
// A second [Caller.Do] for the same key returns the recorded outcome without
// calling, refuses another request under the key ([ErrFingerprintMismatch]),
// and resolves an unknown attempt before anything else. A crash between the
// call and the record leaves the attempt started; past its lease it is
// treated as unknown, since the call may have happened. A caller paused
// between its claim and its call does not call once its lease is (nearly)
// over ([ErrLeaseExpired]): another caller may own the attempt by then.
//
// # Provider modes
//
// What Do can do about an unknown attempt depends on what the provider
// offers, given as [Config.Mode]:
//
//   - [Idempotent]: the provider honours idempotency keys; Do calls again
//     with the same key (the provider returns the first call's result). At
//     most one effect per key, within the provider's key retention.
//   - [Queryable]: no keys, but the provider can be asked about a key
//     ([Lookup]); Do asks first and calls again only when the provider has
//     no record of it. At most one effect per key, provided no call of the
//     key is still in flight when the lookup runs: calls end at
//     Config.CallTimeout, and an attempt is looked up only once its claim
//     (Config.Lease, longer) has ended.
//   - [Neither]: nothing to ask and nothing to dedupe. An unknown attempt is
//     parked for an operator, or, with Config.BlindRetry, called again: a
//     possible duplicate, counted (side_effects.blind_retries and the
//     sideeffect_blind_retries_total metric), so the risk is measured, not
//     hidden.
//
// # Calling over HTTP
//
// Go's net/http transport replays a request that carries an Idempotency-Key
// header when a reused connection closes before the response arrives. With
// an Idempotent provider that is harmless; with one that ignores the key
// (Queryable, Neither) it is a second effect that no record shows. Set
// req.GetBody = nil on such a request (it is then not replayable), or send
// the key under another name.
//
// # Using it from a consumer
//
// Call Do from the inbox's effect (or before it) and keep its record
// separate from the inbox transaction: the attempt commits on its own, so a
// rolled-back inbox transaction and a redelivery find the recorded outcome
// instead of calling again. Use the event id as the key, or [Key] (event id
// and step) when an event causes several calls. On [ErrUnknown] and
// [ErrInProgress], do not acknowledge the event: its redelivery (after
// inbox.RedeliveryDelay, growing and capped) calls Do again, which resolves
// it with the same key. On [ErrParked], do not redeliver it in a loop: Do
// calls nothing until an operator resolves the attempt. Let the event wait
// on it instead (below).
//
// # Waiting on a parked attempt
//
// On [ErrParked], call [Caller.WaitTx] (or [Caller.WaitSQLTx]) in the
// event's inbox transaction with the consumer's name, the key and the
// delivered message, and return nil: the wait (a row of
// side_effect_waits, migration 16) commits with the inbox row, and the
// delivery is acknowledged; its redeliveries are duplicates. Record in the
// same transaction whatever the aggregate's later events must know (the
// inbox applies them meanwhile: the aggregate's order ends at the wait,
// and the resumed handler must check the state they left), e.g. a status
// row saying the charge waits.
//
// [Caller.Resume] (a loop, started by the consumer beside Reconcile, one
// per Caller and consumer) hands the stored message back to the
// consumer's handler ([Resumer]) once the attempt is no longer parked: an
// operator resolved it ([Admin.Resolve], `outbox sideeffect resolve`, the
// console, or an UPDATE by hand). A trigger on side_effects notifies the
// resolution, so Resume runs at once rather than at its next poll
// (Config.ResumePoll). The handler runs in a transaction that holds the
// wait's row lock (FOR UPDATE SKIP LOCKED: two Resume loops never run one
// wait at once) and deletes the wait when the handler returns nil, so what
// the handler writes and the end of the wait commit together: a crash or
// an error before that commit leaves the wait as it was, to be run again,
// and the handler's Do then finds the outcome recorded, never calling
// twice. The handler calls Do again with the same key and request, which
// returns the operator's outcome (Result.Via "operator") or, after
// [ResolveRetry], calls once. Parked again, the handler records the wait
// again (or returns the error) and the event waits for the next
// resolution; any other error is recorded on the wait (last_error) and
// run again after a backoff (Config.CheckInterval, doubling).
//
// # Reconciliation and parking
//
// [Caller.Reconcile] (a loop, started by the consumer) or
// [Caller.ReconcileOnce] takes up unknown attempts, and started ones whose
// lease expired, and asks the provider through the Lookup, with an
// exponential backoff per attempt (Config.CheckInterval doubling up to
// Config.MaxCheckInterval). An attempt still unresolved after
// Config.MaxChecks lookups, or Config.MaxAge after its outcome became
// unknown, is parked with the reason. [Admin.Resolve] settles a parked (or
// unknown) attempt as succeeded or failed, or lets the next Do call again,
// recording who and why on the attempt and in the audit log.
//
// # Metrics and status
//
// Config.Observer is told every call, lookup, replay and park; package
// outboxprom exports them as sideeffect_* series and samples [Admin.Gauges]
// (open attempts by state, the oldest unknown age). `outbox status
// --sideeffect-schema S` shows [Admin.Status]; `outbox sideeffect
// parked|show|resolve` lists and settles parked attempts ([Admin.Waiting]:
// `show` lists the events waiting on one).
// docs/side-effects.md has the state machine and what each mode guarantees.
package sideeffect
