-- outbox 016: events waiting on a parked side effect (package sideeffect,
-- Caller.WaitTx and Caller.Resume). A consumer whose call Do parked for an
-- operator (ErrParked) records here, in the event's inbox transaction,
-- that the event waits on the attempt, with the delivered message, and
-- acknowledges the delivery instead of having it redelivered while nothing
-- can change. Once the attempt is no longer parked (an operator resolved
-- it: sideeffect.Admin.Resolve, `outbox sideeffect resolve`, the console,
-- or an UPDATE by hand), Caller.Resume hands the stored message back to
-- the consumer's handler, in a transaction that holds the wait's row lock
-- and deletes the wait when the handler succeeded: once per resolution,
-- whatever crashes. The table lives in the consumer's schema, beside
-- side_effects; docs/side-effects.md, "Waiting on a parked attempt".
--
-- The trigger on side_effects sends a notification when an attempt leaves
-- the parked state, or becomes succeeded or failed after its outcome was
-- once unknown (a lookup, a retry, an operator), so that Resume wakes at
-- once rather than at its next poll. It never fires on the common path, a
-- call answered at once (its unknown_since stays NULL), nor on a claim.
--
-- Upgrading: a new table, a function and a trigger; nothing rewritten.

CREATE TABLE IF NOT EXISTS side_effect_waits (
    -- The waiting event: one wait per (consumer, event). A wait recorded
    -- again for the same event replaces the attempt it waits on.
    consumer_name  text        NOT NULL CHECK (octet_length(consumer_name) BETWEEN 1 AND 255),
    event_id       uuid        NOT NULL,
    -- The attempt it waits on: side_effects (name, key).
    name           text        NOT NULL,
    key            text        NOT NULL,
    -- The delivered message, handed back to the consumer's handler as it
    -- was given (outbox.Message): the payload's exact bytes, the headers.
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    sequence       bigint      NOT NULL,
    event_type     text        NOT NULL,
    schema_version integer     NOT NULL,
    content_type   text        NOT NULL,
    payload        bytea       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at    timestamptz,
    skipped_from   bigint      NOT NULL DEFAULT 0,
    waiting_since  timestamptz NOT NULL DEFAULT now(),
    -- Counts the recordings of this wait: Resume deletes the wait it read
    -- only if its handler did not record it again (it found the attempt
    -- parked again).
    recorded       integer     NOT NULL DEFAULT 1,
    -- Resume's handling: how often the handler ran for it, the last time,
    -- the last error, and when it may run again (a backoff after an error,
    -- which a change of the attempt since the last run cuts short).
    wakes          integer     NOT NULL DEFAULT 0,
    next_wake_at   timestamptz NOT NULL DEFAULT now(),
    last_woken_at  timestamptz,
    last_error     text,
    PRIMARY KEY (consumer_name, event_id)
);

-- Resume's work: a Caller's waits of one consumer, by when they may run.
CREATE INDEX IF NOT EXISTS side_effect_waits_due_idx
    ON side_effect_waits (name, consumer_name, next_wake_at);

CREATE OR REPLACE FUNCTION side_effects_resolved_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- One channel for every schema (a channel name is limited to 63 bytes,
    -- a schema name is not); the payload says which schema and name.
    PERFORM pg_notify('outbox_sideeffect_resolved',
        json_build_object('schema', TG_TABLE_SCHEMA, 'name', NEW.name)::text);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS side_effects_resolved ON side_effects;
CREATE TRIGGER side_effects_resolved
    AFTER UPDATE OF state ON side_effects
    FOR EACH ROW
    WHEN ((OLD.state = 'parked' AND NEW.state <> 'parked')
        OR (NEW.state IN ('succeeded', 'failed') AND OLD.state <> NEW.state AND NEW.unknown_since IS NOT NULL))
    EXECUTE FUNCTION side_effects_resolved_notify();
