-- outbox consumer 001: the consumer side's tables, for a consumer's own
-- database (outboxmigrate.MigrateComponents with ComponentsConsumer,
-- `outbox migrate --only consumer`), as the full migrations leave them:
-- the inbox tables of 001, the audit log and the inbox clean-up index of
-- 002, the storage settings of 005. The consumer install then runs the full
-- migrations that touch only the consumer side: 004, 007, 008 and 012.
--
-- Keep it in step with the full migrations: a later full migration that
-- changes one of these objects needs a consumer migration doing the same
-- (TestConsumerInstallMatchesTheFullOne compares the two installs). Every
-- statement is idempotent, so that a full migrate after this one (and this
-- one after a full migrate) finds the objects there and leaves them.

-- Consumer inbox: one row per (consumer, event) applied, inserted in the same
-- transaction as the consumer's business effect.
CREATE TABLE IF NOT EXISTS processed_events (
    consumer_name text        NOT NULL,
    event_id      uuid        NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, event_id)
);

-- Per (consumer, aggregate) high-water mark: the last aggregate_sequence the
-- consumer applied (the columns 004 adds come with that migration).
CREATE TABLE IF NOT EXISTS inbox_aggregates (
    consumer_name  text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    last_sequence  bigint      NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, aggregate_type, aggregate_id)
);

-- Inbox clean-up deletes processed_events rows past the inbox horizon in
-- bounded batches.
CREATE INDEX IF NOT EXISTS processed_events_processed_at_idx
    ON processed_events (processed_at);

-- Audit log of operator actions: the inbox's resolves and the side effects'
-- resolutions are recorded here, like the outbox's retries and skips.
CREATE TABLE IF NOT EXISTS outbox_operations (
    operation_id bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    action       text        NOT NULL,
    actor        text        NOT NULL,
    event_id     uuid,
    reason       text,
    detail       jsonb       NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX IF NOT EXISTS outbox_operations_event_idx
    ON outbox_operations (event_id)
    WHERE event_id IS NOT NULL;

-- Storage settings (005 explains them).
ALTER TABLE processed_events SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_vacuum_insert_threshold = 10000
);
ALTER TABLE inbox_aggregates SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000
);
