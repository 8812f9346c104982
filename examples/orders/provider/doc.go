// Package provider is the example's fake payment provider: a separate
// process ("orders provider") with its own PostgreSQL schema, so that its
// charges survive a crash of the payments consumer that calls it, and of the
// provider itself. It plays the external side effect that cannot join the
// consumer's transaction, and is the witness the invariants I6 (no order
// charged more than once) and I7 (no net charge on a cancelled order) are
// checked against.
//
// # API
//
// Handler serves the provider's API:
//
//	POST /charges                 charge {reference, amount, currency} (201; 402 declined)
//	POST /refunds                 refund {charge | reference, amount} (201; 402 failed)
//	GET  /charges/{id}            read a charge
//	GET  /charges?key=K           the charge made by Idempotency-Key K (idempotent mode)
//	GET  /charges?reference=R     the charges of reference R (queryable mode)
//	GET  /refunds?key=K           the refund made by Idempotency-Key K (idempotent mode)
//	GET  /refunds?reference=R     the refunds of reference R's charges (queryable mode)
//	GET  /ledger[?reference=R]    every captured charge and refund, and totals per reference
//	GET  /healthz                 200 when the database answers
//
// ControlHandler serves GET and POST /control/faults on a listener of its
// own (--control-listen), never on the API's.
//
// # Modes
//
// ModeIdempotent honours Idempotency-Key the way the big payment APIs do: the
// first request with a key is executed and its response stored in the same
// transaction as the charge; a repeat with the same request gets the stored
// response replayed (header Idempotent-Replayed: true, same status code); the
// same key with a different request is refused (422); a request whose key is
// still being processed is refused (409) and changed nothing. Validation
// failures (400), requests refused before executing (404, 409) and injected
// failures before commit (500) store nothing, so a retry executes afresh.
//
// ModeQueryable ignores Idempotency-Key (every request is executed as new)
// but lets a caller ask for the charges of a reference, so it can look before
// it retries. ModeNeither ignores keys and offers no lookup: a retry after an
// ambiguous failure may charge twice, and the ledger shows it.
//
// # Faults
//
// Faults (flags --fault, or POST /control/faults) inject latency, a 500
// before or after the commit, a timeout after the commit (the response never
// comes and the connection is closed once the caller gave up), a dropped
// response (the connection is reset after the commit) and a crash after the
// commit (the process kills itself with SIGKILL). Each rule fires with a
// probability, on the next N requests, or after skipping some, drawn from a
// seeded generator so a run can be replayed.
//
// # Client
//
// Client calls the API and classifies failures: errors.Is(err,
// ErrAmbiguous) when the charge may or may not have happened (timeout,
// connection reset, 5xx, a request still in flight); any other error is a
// definite failure (ErrDeclined, ErrInvalid, ErrKeyReused, ErrNotFound, ...).
package provider
