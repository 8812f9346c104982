-- outbox 012: the SQL inbox, so that a consumer in any language applies
-- each event once and in per-aggregate order (docs/sql-api.md is the
-- reference; the names, arguments, answers and SQLSTATEs below are API,
-- versioned with these migrations).
--
--   inbox_claim(consumer, event_id, aggregate_type, aggregate_id, sequence,
--               skipped_from, occurred_at, start_at_first_seen, start_grace,
--               start_reason)
--     RETURNS text: 'apply', 'duplicate' or 'early'
--   inbox_seed(consumer, aggregate_type, aggregate_id, last_applied, reason)
--
-- inbox_claim is called first in the consumer's transaction, the one that
-- applies the event's effect. It answers with the rules and the tables of
-- the Go inbox (inbox.Inbox.Handle, inbox/inbox.go): it locks the
-- (consumer, aggregate) mark row until the transaction ends, so deliveries
-- of one aggregate serialise; 'apply' means the event is recorded as
-- processed and the mark advanced in this transaction: apply the effect
-- and commit (a rollback undoes all three, and the redelivery is answered
-- 'apply' again); 'duplicate' and 'early' mean do not apply it, commit (an
-- early answer records the wait on the mark row, for `outbox inbox
-- status`) and acknowledge, or negatively acknowledge for 'early'. The
-- same table-driven test runs the Go inbox and this function
-- (inbox/sqlinbox_test.go).
--
-- They run with the caller's rights (the consumer role's, see
-- outboxmigrate.Grants), with the search_path pinned to this schema.
--
-- Upgrading: functions only; no table is touched.

SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);

-- inbox_start_point returns the consumer's start point, recording it the
-- first time (inbox.Inbox.StartPoint): the earlier of now() and the start
-- of the oldest transaction open in the cluster, once per consumer, never
-- moved. Recorded in the caller's transaction: a transaction that rolls
-- back records nothing, and the next call records a later point (the safe
-- side: more aggregates wait for their sequence 1).
CREATE OR REPLACE FUNCTION inbox_start_point(consumer text) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
DECLARE
    at timestamptz;
BEGIN
    INSERT INTO inbox_consumers AS c (consumer_name, started_at)
    VALUES (inbox_start_point.consumer, least(now(), (SELECT min(a.xact_start) FROM pg_catalog.pg_stat_activity a
        WHERE a.xact_start IS NOT NULL AND a.backend_type = 'client backend')))
    ON CONFLICT (consumer_name) DO NOTHING
    RETURNING c.started_at INTO at;
    IF at IS NULL THEN
        SELECT c.started_at INTO at FROM inbox_consumers c WHERE c.consumer_name = inbox_start_point.consumer;
    END IF;
    IF at IS NULL THEN
        -- Recorded by a transaction this one's snapshot does not see
        -- (REPEATABLE READ): try the transaction again.
        RAISE EXCEPTION 'inbox consumer %: its start point was recorded by a concurrent transaction; try again', consumer
            USING ERRCODE = '40001';
    END IF;
    RETURN at;
END
$fn$;

CREATE OR REPLACE FUNCTION inbox_claim(
    consumer text, event_id uuid, aggregate_type text, aggregate_id text, sequence bigint,
    skipped_from bigint DEFAULT 0, occurred_at timestamptz DEFAULT NULL,
    start_at_first_seen boolean DEFAULT false, start_grace interval DEFAULT interval '5 minutes',
    start_reason text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
DECLARE
    start_point timestamptz;
    last bigint;
    seen bigint;
    waited interval;
    started boolean;
    skipped boolean;
    first_seen boolean;
    at timestamptz;
    reason text := coalesce(nullif(start_reason, ''),
        'consumer started mid-stream: took the first event seen as the start (inbox_claim start_at_first_seen)');
    hex text;
BEGIN
    IF coalesce(consumer, '') = '' THEN
        RAISE EXCEPTION 'inbox_claim: consumer is empty' USING ERRCODE = '22023', COLUMN = 'consumer';
    ELSIF event_id IS NULL THEN
        RAISE EXCEPTION 'inbox_claim: event_id is NULL' USING ERRCODE = '22023', COLUMN = 'event_id';
    ELSIF coalesce(aggregate_type, '') = '' OR coalesce(aggregate_id, '') = '' OR sequence IS NULL OR sequence < 1 THEN
        RAISE EXCEPTION 'inbox_claim: event % lacks its aggregate type, id or sequence', event_id
            USING ERRCODE = '22023', COLUMN = CASE WHEN coalesce(aggregate_type, '') = '' THEN 'aggregate_type'
                WHEN coalesce(aggregate_id, '') = '' THEN 'aggregate_id' ELSE 'sequence' END;
    ELSIF start_grace IS NULL OR start_grace < interval '0' THEN
        RAISE EXCEPTION 'inbox_claim: start_grace must not be negative' USING ERRCODE = '22023', COLUMN = 'start_grace';
    ELSIF start_at_first_seen IS NULL THEN
        -- NULL (a driver's undefined or None) must not read as "not
        -- strict": NOT NULL is NULL, and an IF on it would apply.
        RAISE EXCEPTION 'inbox_claim: start_at_first_seen is NULL (pass true or false)' USING ERRCODE = '22023', COLUMN = 'start_at_first_seen';
    END IF;
    IF start_at_first_seen THEN
        start_point := inbox_start_point(consumer);
    END IF;

    -- The mark row, created at 0, locked until the transaction ends.
    INSERT INTO inbox_aggregates AS m (consumer_name, aggregate_type, aggregate_id, last_sequence)
    VALUES (inbox_claim.consumer, inbox_claim.aggregate_type, inbox_claim.aggregate_id, 0)
    ON CONFLICT ON CONSTRAINT inbox_aggregates_pkey DO UPDATE SET last_sequence = m.last_sequence
    RETURNING m.last_sequence, m.waiting_seen, clock_timestamp() - m.waiting_since, m.start_kind IS NOT NULL
    INTO last, seen, waited, started;

    -- Every event in between was skipped by an operator and will never come.
    -- Compared as skipped_from - 1 <= last, sequence - 1 > last: last + 1
    -- overflows at the highest bigint mark (a seed may set it).
    skipped := coalesce(skipped_from, 0) >= 1 AND skipped_from - 1 <= last;
    first_seen := start_at_first_seen AND last = 0 AND NOT started AND sequence > 1 AND NOT skipped;
    IF first_seen THEN
        at := occurred_at;
        IF at IS NULL AND substr(event_id::text, 15, 1) = '7' THEN
            -- A UUIDv7's first 48 bits: milliseconds since the epoch.
            hex := substr(replace(event_id::text, '-', ''), 1, 12);
            at := to_timestamp(('x' || lpad(hex, 16, '0'))::bit(64)::bigint / 1000.0);
        END IF;
        IF at IS NULL OR at < start_point - interval '1 minute' THEN
            NULL; -- its history began before the consumer's start
        ELSIF seen IS NOT NULL AND waited >= start_grace AND sequence <= seen THEN
            reason := reason || format('; no event before #%s came within %s (start_grace) of its first delivery, although it occurred after the consumer''s start',
                sequence, start_grace);
        ELSE
            first_seen := false; -- maybe new since the start: wait for its sequence 1
        END IF;
    END IF;

    IF sequence <= last THEN
        RETURN 'duplicate';
    END IF;
    IF sequence - 1 > last AND NOT skipped AND NOT first_seen THEN
        IF seen IS NULL OR seen > sequence THEN
            UPDATE inbox_aggregates m
            -- The delivery's moment, not the caller's transaction start:
            -- start_grace counts from the first early delivery.
            SET waiting_since = coalesce(m.waiting_since, clock_timestamp()), waiting_for = last + 1, waiting_seen = inbox_claim.sequence
            WHERE m.consumer_name = inbox_claim.consumer AND m.aggregate_type = inbox_claim.aggregate_type
              AND m.aggregate_id = inbox_claim.aggregate_id;
        END IF;
        RETURN 'early';
    END IF;

    INSERT INTO processed_events (consumer_name, event_id) VALUES (inbox_claim.consumer, inbox_claim.event_id)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN 'duplicate';
    END IF;

    IF first_seen THEN
        UPDATE inbox_aggregates m
        SET last_sequence = inbox_claim.sequence, updated_at = now(),
            waiting_since = NULL, waiting_for = NULL, waiting_seen = NULL,
            start_kind = 'first_seen', start_prior_mark = 0, start_mark = inbox_claim.sequence - 1,
            started_at = now(), start_reason = reason, start_by = NULL
        WHERE m.consumer_name = inbox_claim.consumer AND m.aggregate_type = inbox_claim.aggregate_type
          AND m.aggregate_id = inbox_claim.aggregate_id;
    ELSIF seen IS NOT NULL THEN
        UPDATE inbox_aggregates m
        SET last_sequence = inbox_claim.sequence, updated_at = now(),
            waiting_since = NULL, waiting_for = NULL, waiting_seen = NULL
        WHERE m.consumer_name = inbox_claim.consumer AND m.aggregate_type = inbox_claim.aggregate_type
          AND m.aggregate_id = inbox_claim.aggregate_id;
    ELSE
        UPDATE inbox_aggregates m
        SET last_sequence = inbox_claim.sequence, updated_at = now()
        WHERE m.consumer_name = inbox_claim.consumer AND m.aggregate_type = inbox_claim.aggregate_type
          AND m.aggregate_id = inbox_claim.aggregate_id;
    END IF;
    RETURN 'apply';
END
$fn$;

-- inbox_seed sets the consumer's mark of an aggregate to last_applied in the
-- caller's transaction (inbox.Inbox.SeedTx): typically the one that restores
-- the consumer's state from a snapshot taken at last_applied. A mark never
-- goes back (SQLSTATE 55000 when last_applied is below it); a seed at the
-- mark does nothing, but a seed at 0 of an aggregate with no recorded start
-- is recorded (strict from sequence 1, even with start_at_first_seen).
CREATE OR REPLACE FUNCTION inbox_seed(consumer text, aggregate_type text, aggregate_id text, last_applied bigint, reason text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
DECLARE
    last bigint;
    started boolean;
BEGIN
    IF coalesce(consumer, '') = '' THEN
        RAISE EXCEPTION 'inbox_seed: consumer is empty' USING ERRCODE = '22023', COLUMN = 'consumer';
    ELSIF coalesce(aggregate_type, '') = '' OR coalesce(aggregate_id, '') = '' THEN
        RAISE EXCEPTION 'inbox_seed: the aggregate type and id are required' USING ERRCODE = '22023',
            COLUMN = CASE WHEN coalesce(aggregate_type, '') = '' THEN 'aggregate_type' ELSE 'aggregate_id' END;
    ELSIF last_applied IS NULL OR last_applied < 0 THEN
        RAISE EXCEPTION 'inbox_seed %/%: last applied sequence % is negative', aggregate_type, aggregate_id, last_applied
            USING ERRCODE = '22023', COLUMN = 'last_applied';
    ELSIF coalesce(reason, '') = '' THEN
        RAISE EXCEPTION 'inbox_seed %/%: a reason is required', aggregate_type, aggregate_id
            USING ERRCODE = '22023', COLUMN = 'reason';
    END IF;
    INSERT INTO inbox_aggregates AS m (consumer_name, aggregate_type, aggregate_id, last_sequence)
    VALUES (inbox_seed.consumer, inbox_seed.aggregate_type, inbox_seed.aggregate_id, 0)
    ON CONFLICT ON CONSTRAINT inbox_aggregates_pkey DO UPDATE SET last_sequence = m.last_sequence
    RETURNING m.last_sequence, m.start_kind IS NOT NULL INTO last, started;
    IF last_applied < last THEN
        RAISE EXCEPTION 'inbox_seed %/% at %: the consumer''s mark is ahead (consumer % is at %)',
            aggregate_type, aggregate_id, last_applied, consumer, last USING ERRCODE = '55000';
    ELSIF last_applied = 0 AND NOT started THEN
        UPDATE inbox_aggregates m
        SET updated_at = now(), start_kind = 'seeded', start_prior_mark = 0, start_mark = 0, started_at = now(),
            start_reason = inbox_seed.reason, start_by = NULL
        WHERE m.consumer_name = inbox_seed.consumer AND m.aggregate_type = inbox_seed.aggregate_type
          AND m.aggregate_id = inbox_seed.aggregate_id;
    ELSIF last_applied > last THEN
        UPDATE inbox_aggregates m
        SET last_sequence = last_applied, updated_at = now(),
            waiting_since = NULL, waiting_for = NULL, waiting_seen = NULL,
            start_kind = 'seeded', start_prior_mark = last, start_mark = last_applied, started_at = now(),
            start_reason = inbox_seed.reason, start_by = NULL
        WHERE m.consumer_name = inbox_seed.consumer AND m.aggregate_type = inbox_seed.aggregate_type
          AND m.aggregate_id = inbox_seed.aggregate_id;
    END IF;
END
$fn$;

REVOKE ALL ON FUNCTION inbox_start_point(text),
    inbox_claim(text, uuid, text, text, bigint, bigint, timestamptz, boolean, interval, text),
    inbox_seed(text, text, text, bigint, text)
    FROM PUBLIC;

SELECT set_config('search_path', format('%I', current_schema()), true);
