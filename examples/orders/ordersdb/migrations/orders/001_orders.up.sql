-- orders 001: the order service's business tables. Names are unqualified:
-- the migrator runs this file with search_path set to the configured schema.

-- The catalogue. Order items reference it, so an order naming an unknown SKU
-- fails on insert and its whole transaction (event included) rolls back.
CREATE TABLE IF NOT EXISTS products (
    sku         text    PRIMARY KEY,
    name        text    NOT NULL,
    price_cents integer NOT NULL CHECK (price_cents >= 0)
);

INSERT INTO products (sku, name, price_cents) VALUES
    ('SKU-1001', 'Espresso beans 1kg', 2490),
    ('SKU-1002', 'Filter papers x100', 390),
    ('SKU-1003', 'Hand grinder', 5900),
    ('SKU-1004', 'Milk jug 600ml', 1450),
    ('SKU-1005', 'Kettle gooseneck', 4990),
    ('SKU-1006', 'Scale 0.1g', 2990),
    ('SKU-1007', 'Tamper 58mm', 3490),
    ('SKU-1008', 'Cleaning tablets x50', 990)
ON CONFLICT (sku) DO NOTHING;

CREATE TABLE IF NOT EXISTS orders (
    order_id     text        PRIMARY KEY,
    customer_id  text        NOT NULL CHECK (customer_id <> ''),
    status       text        NOT NULL CHECK (status IN ('created', 'cancelled')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    cancelled_at timestamptz
);

CREATE TABLE IF NOT EXISTS order_items (
    order_id text    NOT NULL REFERENCES orders (order_id),
    sku      text    NOT NULL REFERENCES products (sku),
    quantity integer NOT NULL CHECK (quantity > 0),
    position integer NOT NULL,
    PRIMARY KEY (order_id, sku)
);

-- Idempotency-Key header values of POST /orders. request_hash is the SHA-256
-- of the canonical request, so a reused key with a different body is refused.
-- The row is written in the order's transaction: a rolled-back create frees
-- the key again.
CREATE TABLE IF NOT EXISTS order_idempotency_keys (
    idempotency_key text        PRIMARY KEY,
    request_hash    bytea       NOT NULL,
    order_id        text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
