-- payments 001: the payments consumer's tables. One row per order: the
-- charge (the provider's id, recorded when captured), the refund, and
-- whether the order was cancelled (a StockReserved that comes after the
-- cancellation charges nothing).

CREATE TABLE IF NOT EXISTS payments (
    order_id      text        PRIMARY KEY,
    amount_cents  bigint      NOT NULL DEFAULT 0,
    currency      text        NOT NULL DEFAULT 'eur',
    status        text        NOT NULL CHECK (status IN ('cancelled_before_charge', 'captured', 'failed', 'refunded', 'refund_failed')),
    charge_id     text,
    refund_id     text,
    reason        text,
    cancelled     boolean     NOT NULL DEFAULT false,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
