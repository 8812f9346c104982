-- outbox 001: the outbox table, the per-aggregate sequence counters and the
-- consumer inbox. Object names are unqualified: the migrator runs this file
-- with search_path set to the configured schema, and so can any migration tool.

-- One row per aggregate that ever had an event. last_sequence is the highest
-- aggregate_sequence handed out; it is never lowered, so sequences are not
-- reused after clean-up deletes old events. Writers of the same aggregate
-- serialise on this row until they commit.
CREATE TABLE IF NOT EXISTS outbox_aggregates (
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    last_sequence  bigint NOT NULL CHECK (last_sequence > 0),
    PRIMARY KEY (aggregate_type, aggregate_id)
);

CREATE TABLE IF NOT EXISTS outbox_events (
    event_id           uuid        PRIMARY KEY,
    aggregate_type     text        NOT NULL CHECK (aggregate_type <> ''),
    aggregate_id       text        NOT NULL CHECK (aggregate_id <> ''),
    aggregate_sequence bigint      NOT NULL CHECK (aggregate_sequence > 0),
    event_type         text        NOT NULL CHECK (event_type <> ''),
    schema_version     integer     NOT NULL DEFAULT 1 CHECK (schema_version > 0),
    payload            jsonb       NOT NULL,
    headers            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at        timestamptz NOT NULL DEFAULT now(),
    available_at       timestamptz NOT NULL DEFAULT now(),
    claimed_by         text,
    claim_token        uuid,
    claim_until        timestamptz,
    published_at       timestamptz,
    attempt_count      integer     NOT NULL DEFAULT 0,
    last_error         text,
    quarantined_at     timestamptz,
    UNIQUE (aggregate_type, aggregate_id, aggregate_sequence)
);

-- The relay's scan: only unpublished rows are indexed, so the claim stays
-- O(batch) however many published rows are retained.
CREATE INDEX IF NOT EXISTS outbox_dispatch_idx
    ON outbox_events (available_at, occurred_at)
    WHERE published_at IS NULL;

-- The relay's ordering check ("is there an earlier unpublished event of this
-- aggregate?") probes this small index instead of the aggregate's history.
CREATE INDEX IF NOT EXISTS outbox_pending_lane_idx
    ON outbox_events (aggregate_type, aggregate_id, aggregate_sequence)
    WHERE published_at IS NULL;

-- Consumer inbox: one row per (consumer, event) applied, inserted in the same
-- transaction as the consumer's business effect.
CREATE TABLE IF NOT EXISTS processed_events (
    consumer_name text        NOT NULL,
    event_id      uuid        NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, event_id)
);

-- Per (consumer, aggregate) high-water mark: the last aggregate_sequence the
-- consumer applied. It refuses out-of-order events and keeps deduplicating an
-- aggregate's old events after their processed_events rows were cleaned up.
CREATE TABLE IF NOT EXISTS inbox_aggregates (
    consumer_name  text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    last_sequence  bigint      NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, aggregate_type, aggregate_id)
);
