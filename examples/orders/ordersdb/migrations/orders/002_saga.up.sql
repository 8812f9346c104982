-- orders 002: the order saga. An order is confirmed once it is paid, or
-- cancelled with a reason; order_sagas holds the saga's state per order and
-- order_saga_steps its history (what happened, when, why, and who for an
-- operator's resolution).

ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check CHECK (status IN ('created', 'confirmed', 'cancelled'));
ALTER TABLE orders ADD COLUMN IF NOT EXISTS cancel_reason text;
ALTER TABLE orders ADD COLUMN IF NOT EXISTS confirmed_at timestamptz;

CREATE TABLE IF NOT EXISTS order_sagas (
    order_id   text        PRIMARY KEY,
    state      text        NOT NULL CHECK (state IN ('started', 'stock_reserved', 'confirmed', 'cancelling', 'cancelled', 'needs_attention')),
    reason     text,
    attention_since timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS order_sagas_attention ON order_sagas (attention_since) WHERE state = 'needs_attention';

CREATE TABLE IF NOT EXISTS order_saga_steps (
    order_id text        NOT NULL,
    seq      bigint      GENERATED ALWAYS AS IDENTITY,
    step     text        NOT NULL,
    state    text        NOT NULL,
    reason   text,
    actor    text,
    event_id uuid,
    at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, seq)
);
