-- outbox 004: where a consumer's aggregate started, and which aggregates wait
-- on a gap.
--
-- Upgrading a large table: the new columns are nullable without a default, a
-- catalogue change that rewrites nothing. The one index is partial and covers
-- only waiting rows (none before this version), but CREATE INDEX still reads
-- the whole table while it blocks writes to it: on a big inbox_aggregates,
-- create it first with CREATE INDEX CONCURRENTLY (same name and definition,
-- outside a transaction); this file then finds it and does nothing more.

-- The start of an aggregate, when the consumer's high-water mark was set
-- explicitly instead of by applying events one by one:
--
--   first_seen  the inbox (inbox.Config.StartAtFirstSeen) took the first
--               event it saw of an aggregate it had no mark for as the start,
--               because the consumer joined the stream after it began;
--   seeded      the application set the mark (inbox.Inbox.Seed), e.g. after
--               restoring its state from a snapshot;
--   resolved    an operator moved the mark past a gap (outbox inbox resolve),
--               for events the broker will never deliver again.
--
-- start_mark is the mark that was set: events of the aggregate up to it count
-- as applied. start_prior_mark is the mark before (0 for an aggregate new to
-- the consumer): the events start_prior_mark + 1 .. start_mark were never
-- applied by this consumer. started_at is when, start_reason why, start_by who
-- (an operator's name for resolved, else NULL). Only the latest start is kept
-- here; every resolve is also in the audit log (outbox_operations, action
-- inbox_resolve). All NULL: the consumer applied every event of the aggregate
-- from sequence 1 (the default, strict behaviour).
ALTER TABLE inbox_aggregates
    ADD COLUMN IF NOT EXISTS start_kind       text,
    ADD COLUMN IF NOT EXISTS start_prior_mark bigint,
    ADD COLUMN IF NOT EXISTS start_mark       bigint,
    ADD COLUMN IF NOT EXISTS started_at       timestamptz,
    ADD COLUMN IF NOT EXISTS start_reason     text,
    ADD COLUMN IF NOT EXISTS start_by         text;

-- A gap: the inbox refused an event as early (an earlier one has not been
-- applied). waiting_since is when it first did, waiting_for the sequence it
-- expects (last_sequence + 1 then), waiting_seen the lowest sequence it has
-- seen since. Applying an event, a seed and a resolve clear them, so a row
-- with waiting_since set is an aggregate stuck until the missing event
-- arrives or an operator resolves the gap. Only the first early delivery of a
-- wait (or a lower sequence) writes them: redeliveries of a waiting aggregate
-- cost no more than before.
ALTER TABLE inbox_aggregates
    ADD COLUMN IF NOT EXISTS waiting_since timestamptz,
    ADD COLUMN IF NOT EXISTS waiting_for   bigint,
    ADD COLUMN IF NOT EXISTS waiting_seen  bigint;

-- NOT VALID: existing rows (no start, not waiting) are not rescanned under the
-- ALTER's lock; new and updated rows are checked.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conname = 'inbox_aggregates_start_check' AND conrelid = 'inbox_aggregates'::regclass) THEN
        ALTER TABLE inbox_aggregates ADD CONSTRAINT inbox_aggregates_start_check CHECK (
            start_kind IS NULL OR (
                start_kind IN ('first_seen', 'seeded', 'resolved')
                AND start_mark >= 0 AND start_prior_mark BETWEEN 0 AND start_mark
                AND started_at IS NOT NULL
                AND coalesce(start_reason, '') <> '')) NOT VALID;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conname = 'inbox_aggregates_waiting_check' AND conrelid = 'inbox_aggregates'::regclass) THEN
        ALTER TABLE inbox_aggregates ADD CONSTRAINT inbox_aggregates_waiting_check CHECK (
            waiting_since IS NULL OR waiting_seen > waiting_for) NOT VALID;
    END IF;
END $$;

-- Waiting aggregates are few (a healthy consumer has none): `outbox inbox
-- status` and the inbox_waiting_aggregates gauge read this nearly empty index,
-- never the marks of every aggregate. The normal apply path leaves
-- waiting_since NULL, so its updates stay HOT and never touch this index.
CREATE INDEX IF NOT EXISTS inbox_aggregates_waiting_idx
    ON inbox_aggregates (consumer_name, waiting_since)
    WHERE waiting_since IS NOT NULL;
