-- outbox 002: operations. Skipping a quarantined event, the relays'
-- heartbeats, an audit log of operator actions, and the indexes that keep
-- status, metrics and clean-up bounded.
--
-- Upgrading a large table: everything here is a catalogue change except the
-- new indexes, which CREATE INDEX builds while blocking writes to the table.
-- On a big outbox_events or processed_events, create them first with
-- CREATE INDEX CONCURRENTLY (same names and definitions, outside a
-- transaction); this file then finds them and does nothing more.

-- A skipped event is settled without being published: the operator gave up
-- on a quarantined event to unblock its aggregate. Skipping sets published_at
-- too (to the time of the skip), so that every "unsettled" predicate stays
-- "published_at IS NULL": the claim's lane check, outbox_dispatch_idx and
-- outbox_pending_lane_idx need no change, and the event leaves them like a
-- published one. skipped_at tells the two apart: a published event has
-- published_at set and skipped_at NULL.
--
-- skipped_from is the first sequence of the run of skipped events that ends
-- with this one (this event's own sequence when the event before it was not
-- skipped). The next event of the aggregate carries it to consumers
-- (Message.SkippedFrom), so that an inbox accepts that event although the
-- skipped ones never arrive.
ALTER TABLE outbox_events
    ADD COLUMN IF NOT EXISTS skipped_at   timestamptz,
    ADD COLUMN IF NOT EXISTS skipped_by   text,
    ADD COLUMN IF NOT EXISTS skip_reason  text,
    ADD COLUMN IF NOT EXISTS skipped_from bigint;

-- NOT VALID: existing rows (all unskipped) are not rescanned under the
-- ALTER's lock; new and updated rows are checked.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conname = 'outbox_events_skip_check' AND conrelid = 'outbox_events'::regclass) THEN
        ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_skip_check CHECK (
            skipped_at IS NULL OR (
                published_at IS NOT NULL
                AND coalesce(skipped_by, '') <> ''
                AND coalesce(skip_reason, '') <> ''
                AND skipped_from BETWEEN 1 AND aggregate_sequence)) NOT VALID;
    END IF;
END $$;

-- The claim probes, for each event it returns, whether the event before it
-- was skipped. Skipped events are rare: this index is nearly empty, so the
-- probe costs one page instead of a descent of the unique index.
CREATE INDEX IF NOT EXISTS outbox_skipped_idx
    ON outbox_events (aggregate_type, aggregate_id, aggregate_sequence)
    WHERE skipped_at IS NOT NULL;

-- Clean-up deletes settled events in published_at order, in bounded batches,
-- and status counts "published in the last minute": both are range scans
-- here instead of scans of the table.
CREATE INDEX IF NOT EXISTS outbox_published_at_idx
    ON outbox_events (published_at)
    WHERE published_at IS NOT NULL;

-- Quarantined events are few; counting and listing them reads this index,
-- not the whole backlog.
CREATE INDEX IF NOT EXISTS outbox_quarantined_idx
    ON outbox_events (quarantined_at)
    WHERE quarantined_at IS NOT NULL AND published_at IS NULL;

-- Inbox clean-up deletes processed_events rows past the inbox horizon in
-- bounded batches.
CREATE INDEX IF NOT EXISTS processed_events_processed_at_idx
    ON processed_events (processed_at);

-- One row per running relay, refreshed every heartbeat interval. A relay is
-- alive while expires_at is in the future; a relay that stops cleanly deletes
-- its row, a dead one's row expires (and is pruned an hour later).
CREATE TABLE IF NOT EXISTS outbox_relays (
    relay_id     text        PRIMARY KEY,
    hostname     text        NOT NULL DEFAULT '',
    pid          integer     NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);

-- Audit log of operator actions (retry, skip, replay): who, when, what, why.
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
