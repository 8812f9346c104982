-- payments 002: a refund whose outcome is still unknown after the
-- cancellation's last delivery (--refund-attempts), or whose call the
-- side-effect helper parked. The saga is parked meanwhile; the payments
-- consumer keeps resolving the refund (the helper's lookups, or an
-- operator's `outbox sideeffect resolve`) and records PaymentRefunded or
-- RefundFailed once it knows, instead of guessing "failed".

ALTER TABLE payments DROP CONSTRAINT IF EXISTS payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check
    CHECK (status IN ('cancelled_before_charge', 'captured', 'failed', 'refunded', 'refund_unknown', 'refund_failed'));

-- The resolver reads the few refunds still unknown.
CREATE INDEX IF NOT EXISTS payments_refund_unknown ON payments (updated_at) WHERE status = 'refund_unknown';
