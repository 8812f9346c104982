// Package payments is the example's payments consumer, the saga's second
// step (docs/saga.md). It reads two aggregate types from the destination:
//
//   - StockReserved (aggregate type "inventory"): it charges the order's
//     total at the payment provider through a sideeffect.Caller, with the
//     idempotency key "<order id>/charge" (also the charge's reference, so
//     that the provider's ledger and the queryable mode's lookup find it),
//     and records PaymentCaptured or PaymentFailed;
//   - OrderCancelled (aggregate type "order"): when the order's charge was
//     captured it refunds it, key "<order id>/refund", and records
//     PaymentRefunded; a cancellation that comes before the charge makes the
//     later StockReserved charge nothing (PaymentFailed, "order cancelled").
//
// Each event is applied through the inbox, and its event (aggregate type
// "payment") is recorded through the outbox in the inbox transaction, with
// the payments row. The provider call's own record is the side-effect
// helper's, committed apart: a redelivery after a crash finds it and never
// charges with a new key. An ambiguous outcome is not acknowledged: the
// event comes again and the helper resolves it (lookup, or the same key).
// A charge the helper parks for an operator is not redelivered in a loop:
// the StockReserved is applied as charge_parked (the payments row, with the
// reason), waiting on the attempt (sideeffect.Caller.WaitTx, in the inbox
// transaction), and acknowledged; an operator's `outbox sideeffect
// resolve` wakes the helper's Resume (run by Run), which hands the event
// back to charge or fail the order with the same key, once.
//
// A refund whose outcome is unknown is retried with the redelivery's
// backoff. When the provider refuses it for good, the consumer records
// RefundFailed, which parks the saga as needs_attention in the order
// service. When it is still unknown at Config.RefundAttempts deliveries, or
// the helper parks its call, the consumer records RefundUnknown instead (the
// saga is parked with the reason: the refund may have happened) and
// acknowledges the cancellation, waiting on the refund's attempt; the
// helper's Resume keeps driving the refund with the same key and records
// PaymentRefunded (the saga ends cancelled) or RefundFailed once the
// reconciler's lookup, a retry, or an operator's `outbox sideeffect
// resolve` decides it.
package payments
