-- payments 003: a charge whose call the side-effect helper parked for an
-- operator (an ambiguous outcome it could not resolve). The StockReserved
-- is applied as "charge_parked" and acknowledged instead of being
-- redelivered until the operator acts; the payments consumer's resolver
-- charges (or fails) the order once `outbox sideeffect resolve` settled
-- the call, with the same idempotency key, and records PaymentCaptured or
-- PaymentFailed then.

ALTER TABLE payments DROP CONSTRAINT IF EXISTS payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check
    CHECK (status IN ('cancelled_before_charge', 'charge_parked', 'captured', 'failed', 'refunded', 'refund_unknown', 'refund_failed'));

-- The resolver reads the few charges parked.
CREATE INDEX IF NOT EXISTS payments_charge_parked ON payments (updated_at) WHERE status = 'charge_parked';
