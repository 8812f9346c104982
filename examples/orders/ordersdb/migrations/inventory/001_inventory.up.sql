-- inventory 001: the inventory consumer's business tables. Names are
-- unqualified: the migrator runs this file with search_path set to the
-- configured schema.

-- Reserved quantity per SKU: the sum of the live reservations.
CREATE TABLE IF NOT EXISTS inventory_stock (
    sku        text        PRIMARY KEY,
    reserved   bigint      NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One row per (order, SKU) reserved by an OrderCreated event; an
-- OrderCancelled event releases them.
CREATE TABLE IF NOT EXISTS inventory_reservations (
    order_id    text        NOT NULL,
    sku         text        NOT NULL,
    quantity    integer     NOT NULL CHECK (quantity > 0),
    status      text        NOT NULL CHECK (status IN ('reserved', 'released')),
    event_id    uuid        NOT NULL,
    reserved_at timestamptz NOT NULL DEFAULT now(),
    released_at timestamptz,
    PRIMARY KEY (order_id, sku)
);
