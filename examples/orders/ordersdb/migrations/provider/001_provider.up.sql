-- provider 001: the fake payment provider's own tables (orders provider).
-- Names are unqualified: the migrator runs this file with search_path set to
-- the provider's schema ("provider" by default), which no other part writes.

-- Every charge the provider decided: succeeded (money captured) or declined
-- (a definite failure, nothing captured). idempotency_key is the header the
-- request carried, kept even in the modes that ignore it, so the ledger shows
-- which retries became duplicates.
CREATE TABLE IF NOT EXISTS provider_charges (
    charge_id       text        PRIMARY KEY,
    reference       text        NOT NULL,
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('succeeded', 'declined')),
    failure_code    text,
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS provider_charges_reference_idx ON provider_charges (reference);
CREATE INDEX IF NOT EXISTS provider_charges_key_idx ON provider_charges (idempotency_key);

CREATE TABLE IF NOT EXISTS provider_refunds (
    refund_id       text        PRIMARY KEY,
    charge_id       text        NOT NULL REFERENCES provider_charges (charge_id),
    amount          bigint      NOT NULL CHECK (amount >= 0),
    status          text        NOT NULL CHECK (status IN ('succeeded', 'failed')),
    failure_code    text,
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS provider_refunds_charge_idx ON provider_refunds (charge_id);
CREATE INDEX IF NOT EXISTS provider_refunds_key_idx ON provider_refunds (idempotency_key);

-- The stored outcome of each Idempotency-Key (idempotent mode only), written
-- in the same transaction as the charge or refund it answers: the status
-- code and body are replayed for a repeat of the same request; request_hash
-- (SHA-256 of the endpoint and the canonical request) refuses a reuse of the
-- key with a different request.
CREATE TABLE IF NOT EXISTS provider_idempotency_keys (
    idempotency_key text        PRIMARY KEY,
    endpoint        text        NOT NULL,
    request_hash    bytea       NOT NULL,
    status_code     integer     NOT NULL,
    response        jsonb       NOT NULL,
    object_id       text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The ledger: one append-only row per movement of money (a captured charge,
-- a succeeded refund), written in the transaction that moved it. It is the
-- witness the tests and the checker read: no reference charged more than
-- once (I6), and captures minus refunds per reference (I7).
CREATE TABLE IF NOT EXISTS provider_ledger (
    entry_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind            text        NOT NULL CHECK (kind IN ('charge', 'refund')),
    object_id       text        NOT NULL UNIQUE,
    charge_id       text        NOT NULL,
    reference       text        NOT NULL,
    amount          bigint      NOT NULL,
    currency        text        NOT NULL,
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS provider_ledger_reference_idx ON provider_ledger (reference);
