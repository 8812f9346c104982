-- outbox 018: cleanup_events deletes nothing from a partitioned
-- outbox_events; partition_closed() closes a partition to new events before
-- the relay's upkeep drops it.
--
-- Migration 011's cleanup_events finds the rows it deletes by ctid (a TID
-- scan; "event_id IN (...)" may be planned as a hash join over the whole
-- table). A ctid is unique within one table only: on a partitioned
-- outbox_events (outboxmigrate.Partition) the DELETE's "ctid = ANY (...)"
-- matched the rows at those positions in every partition, unpublished
-- ones included. The relay and operator roles, which delete events through
-- this function only and "never an unpublished one", deleted pending
-- events by calling it: an operator by hand, a relay of an earlier version
-- during an upgrade, a relay whose clean-up run read the table as plain
-- just before its conversion.
--
-- A partitioned outbox_events loses its settled events with their
-- partitions (the relay's partition upkeep), never by DELETE: on one, the
-- function now deletes nothing and returns 0. On a plain table it is
-- migration 011's statement; the check of the table's kind is a one-time
-- filter (an InitPlan evaluated once), which changes neither the plan nor
-- the estimates of the scan.
--
-- partition_closed() is the trigger function of the fence the upkeep puts
-- on a partition (BEFORE INSERT, trigger outbox_partition_closed) once its
-- events are all settled and past the horizon, before it checks it again
-- and detaches it: creating the trigger waits for every transaction that
-- wrote into the partition, and from then on an event with an id that old
-- (a long transaction's, minted when it began; a clock far behind) is
-- refused, with SQLSTATE 23514 and the constraint name
-- outbox_partition_closed (outbox.ErrNoPartition), rather than committed
-- into a partition on its way out: out of outbox_events while its detach
-- was pending or left unfinished, such an event was overtaken by its
-- aggregate's next one (the claim reads a missing predecessor as one
-- cleaned up after publication).
--
-- Upgrading: functions only; no table is touched. cleanup_events keeps
-- its owner and grants (CREATE OR REPLACE); partition_closed() is a
-- trigger function nobody calls (EXECUTE revoked from PUBLIC).

SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);

CREATE OR REPLACE FUNCTION cleanup_events(older_than interval, batch integer) RETURNS bigint
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER
SET search_path FROM CURRENT
AS $fn$
WITH gone AS (
    DELETE FROM outbox_events WHERE ctid = ANY (ARRAY(
        SELECT e.ctid FROM outbox_events e
        WHERE (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = 'outbox_events'::regclass) = 'r'
          AND e.published_at IS NOT NULL AND e.published_at < now() - older_than
          AND (e.skipped_at IS NULL OR (
            (SELECT a.last_sequence FROM outbox_aggregates a
             WHERE a.aggregate_type = e.aggregate_type AND a.aggregate_id = e.aggregate_id) > e.aggregate_sequence
            AND NOT EXISTS (SELECT 1 FROM outbox_events n
                WHERE n.aggregate_type = e.aggregate_type AND n.aggregate_id = e.aggregate_id
                  AND n.aggregate_sequence = e.aggregate_sequence + 1)))
        ORDER BY e.published_at
        LIMIT batch
        FOR UPDATE SKIP LOCKED))
    RETURNING 1)
SELECT count(*) FROM gone
$fn$;

CREATE OR REPLACE FUNCTION partition_closed() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    RAISE EXCEPTION 'partition % of outbox_events is closed: its events are settled and past the replay horizon, and it is being dropped', TG_TABLE_NAME
        USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_partition_closed',
              HINT = 'Event ids are UUIDv7s of the time they were made; this one is too old. Leave the id to the writer (new_event_id()), and keep transactions short.';
END
$fn$;

REVOKE ALL ON FUNCTION partition_closed() FROM PUBLIC;

SELECT set_config('search_path', format('%I', current_schema()), true);
