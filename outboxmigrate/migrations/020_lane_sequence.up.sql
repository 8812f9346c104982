-- outbox 020: a write costs the same under a transaction that holds the
-- xmin as without one.
--
-- Every enqueue used to update its aggregate's counter row
-- (outbox_aggregates.last_sequence + 1). An UPDATE leaves a row version
-- that no vacuum may remove while any transaction older than it is open
-- (a forgotten psql session, a long report), and the next update of the
-- same row walks every such version (the unique check of the upsert, one
-- heap visit per version). At 800 events/s over 2,000 aggregates the
-- enqueue touched 16 buffers a call with nothing open and 143 after six
-- minutes of a pinned xmin (0.50 -> 0.75 ms; BENCHMARKS.md, "stop 42"),
-- the writers' share of the database's CPU grew with it, and the relay's
-- claims waited behind them for the two cores.
--
-- Now, in READ COMMITTED (the default) on an unpartitioned outbox_events,
-- a write locks the counter row without a new version (INSERT ... ON
-- CONFLICT DO UPDATE ... WHERE false: PostgreSQL locks the conflicting row
-- and updates nothing) and, in a statement of its own (a snapshot taken
-- once the lock is held, so it sees every event of the lane committed
-- before), takes the next sequence from the lane's last event
-- (the UNIQUE index of migration 001, read backwards: a few buffers,
-- whatever the versions of other rows). The counter row keeps its lock,
-- which orders the lane's writers and the relay's parking, and its
-- parked_at flag; last_sequence becomes a floor: at least the highest
-- sequence deleted from the lane, exact for a lane created by the write
-- (its first events), raised by clean-up before it deletes any event above
-- it.
-- The lane's last sequence is greatest(last_sequence, the highest
-- aggregate_sequence in outbox_events) (lane_last()).
--
-- Where the floor cannot serve, a write still moves the counter, exact as
-- before: on a partitioned outbox_events (the conversion, outbox migrate
-- --partitioned, first raises every counter to its lane's last event) (no UNIQUE index across
-- partitions, and reading every partition's index would cost more than
-- the version), and under REPEATABLE READ or SERIALIZABLE (a snapshot
-- taken before the lock cannot see the lane's last event, and the
-- counter's update keeps the serialization failure, 40001, that a
-- concurrent write to the same aggregate gave; a concurrent READ
-- COMMITTED write, which only locks the row, makes the later insert fail
-- on the UNIQUE index instead, 23505: retry either).
--
-- Upgrading: functions only (CREATE OR REPLACE keeps their owner, grants
-- and the payload limit raised on enqueue_many); no table is touched, and
-- every counter row is already exact, so a floor. Writers of the previous
-- version and these functions take sequences under the same row lock and
-- agree (the previous version's upsert reads the counter, which is exact
-- while only it writes; a lane both versions write to during a rolling
-- upgrade gets its next sequence from greatest(floor, last event) here
-- and from last_sequence + 1 there: clean-up keeps the floor at or above
-- every sequence it deletes, so where they differ the number is one the
-- lane still has, and the UNIQUE index refuses the older writer's insert
-- (23505), never a duplicate).

SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);

SELECT set_config('outbox.migrate_limit_many', coalesce((SELECT split_part(c, '=', 2)
        FROM pg_proc p, unnest(p.proconfig) c
        WHERE p.oid = 'enqueue_many(jsonb)'::regprocedure
          AND c LIKE 'outbox.max\_payload\_bytes=%'), '1048576'), true);

-- lane_last is the last sequence handed out on a lane: its counter row's
-- floor or its last event, whichever is higher (0 for a lane never
-- written). Readers of the lane's end use it (status, parking, clean-up).
CREATE OR REPLACE FUNCTION lane_last(aggregate_type text, aggregate_id text) RETURNS bigint
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $fn$
SELECT greatest(
    (SELECT a.last_sequence FROM outbox_aggregates a
     WHERE a.aggregate_type = lane_last.aggregate_type AND a.aggregate_id = lane_last.aggregate_id),
    (SELECT e.aggregate_sequence FROM outbox_events e
     WHERE e.aggregate_type = lane_last.aggregate_type AND e.aggregate_id = lane_last.aggregate_id
     ORDER BY e.aggregate_sequence DESC LIMIT 1),
    0)
$fn$;

-- lane_bases takes the lanes of a write (types[k], ids[k], counts[k]
-- events each; distinct lanes) and returns, per lane, the sequence its
-- first event follows and its parked flag. It locks (or creates) the
-- counter rows in one statement in (type, id) order, the order writers
-- never deadlock in; then, in a second statement whose snapshot sees
-- every event committed before the locks were granted, reads each lane's
-- last sequence. Only the exact-counter writes (above) and the parking
-- watermark of a parked lane (parked_through, when it reached the lane's
-- end) update the row.
CREATE OR REPLACE FUNCTION lane_bases(types text[], ids text[], counts integer[])
RETURNS TABLE (aggregate_type text, aggregate_id text, base bigint, parked_at timestamptz)
LANGUAGE plpgsql VOLATILE
-- Parameters are arrays: PostgreSQL's custom plans of its statements
-- looked cheaper than the generic ones, and it planned them again at every
-- call (0.5 ms of a write's 1 ms).
SET plan_cache_mode = force_generic_plan
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
DECLARE
    created text[];
    partitioned boolean;
    exact boolean;
BEGIN
    -- outbox_events' lock first (its parent only: not every partition's,
    -- which upkeep would wait for to drop one), held to the transaction's
    -- end, then the counter rows: the order of every other party (the
    -- relay's settles and lane sweep, operators, clean-up), and the one
    -- that lets the partitioned conversion (outbox migrate --partitioned)
    -- make every counter exact under its lock on outbox_events without
    -- waiting for a writer that waits for it. Whether the table is
    -- partitioned is read after the lock: a write that waited for the
    -- conversion finds the partitioned table (PostgreSQL resolves the name
    -- again once it holds the lock).
    LOCK TABLE ONLY outbox_events IN ACCESS SHARE MODE;
    partitioned := pg_catalog.pg_get_partkeydef('outbox_events'::regclass) IS NOT NULL; -- the catalog cache: no query
    exact := partitioned OR current_setting('transaction_isolation') <> 'read committed';
    WITH l AS (
        SELECT * FROM unnest(types, ids, counts) AS u(t, i, n)
    ), ins AS (
        INSERT INTO outbox_aggregates AS a (aggregate_type, aggregate_id, last_sequence)
        SELECT l.t, l.i, l.n FROM l ORDER BY l.t, l.i
        ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_sequence = a.last_sequence WHERE false
        RETURNING a.aggregate_type || chr(31) || a.aggregate_id AS k
    )
    SELECT coalesce(array_agg(ins.k), '{}') INTO created FROM ins;
    IF partitioned THEN
        -- The counter is exact: the base is its value, and it moves.
        RETURN QUERY
        WITH l AS (
            SELECT u.t, u.i, u.n, (u.t || chr(31) || u.i) = ANY (created) AS made
            FROM unnest(types, ids, counts) AS u(t, i, n)
        ), b AS (
            SELECT l.t, l.i, l.n, l.made, a.parked_at,
                CASE WHEN l.made THEN 0::bigint ELSE a.last_sequence END AS base
            FROM l JOIN outbox_aggregates a ON a.aggregate_type = l.t AND a.aggregate_id = l.i
        ), moved AS (
            UPDATE outbox_aggregates a SET last_sequence = b.base + b.n,
                parked_through = CASE WHEN a.parked_through = b.base THEN b.base + b.n ELSE a.parked_through END
            FROM b
            WHERE NOT b.made AND a.aggregate_type = b.t AND a.aggregate_id = b.i
        )
        SELECT b.t, b.i, b.base, b.parked_at FROM b;
        RETURN;
    END IF;
    RETURN QUERY
    WITH l AS (
        SELECT u.t, u.i, u.n, (u.t || chr(31) || u.i) = ANY (created) AS made
        FROM unnest(types, ids, counts) AS u(t, i, n)
    ), b AS (
        SELECT l.t, l.i, l.n, l.made, a.parked_at, a.parked_through,
            CASE WHEN l.made THEN 0::bigint
                 ELSE greatest(a.last_sequence, coalesce((SELECT e.aggregate_sequence FROM outbox_events e
                     WHERE e.aggregate_type = l.t AND e.aggregate_id = l.i
                     ORDER BY e.aggregate_sequence DESC LIMIT 1), 0))
            END AS base
        FROM l JOIN outbox_aggregates a ON a.aggregate_type = l.t AND a.aggregate_id = l.i
    ), moved AS (
        -- Under REPEATABLE READ the counter moves (exact), as before; in
        -- READ COMMITTED only a parked lane's watermark does.
        UPDATE outbox_aggregates a SET
            last_sequence = CASE WHEN exact THEN b.base + b.n ELSE a.last_sequence END,
            parked_through = CASE WHEN a.parked_through = b.base THEN b.base + b.n ELSE a.parked_through END
        FROM b
        WHERE NOT b.made AND (exact OR b.parked_through = b.base)
          AND a.aggregate_type = b.t AND a.aggregate_id = b.i
    )
    SELECT b.t, b.i, b.base, b.parked_at FROM b;
END
$fn$;

-- enqueue_one is lane_bases for one event, inline: statements with scalar
-- parameters, whose plans a session keeps (the single-event write is the
-- common case, and the one the Go writer's fast path calls).
CREATE OR REPLACE FUNCTION enqueue_one(
    aggregate_type text, aggregate_id text, event_type text, payload bytea,
    content_type text, headers jsonb, traceparent text, schema_version integer, id uuid)
RETURNS TABLE (event_id uuid, sequence bigint, occurred_at timestamptz)
LANGUAGE plpgsql VOLATILE
AS $fn$
#variable_conflict use_column
DECLARE
    h jsonb;
    eid uuid := event_id_or_new(enqueue_one.id);
    seq bigint := 1;
    last bigint;
    through bigint;
    parked timestamptz;
    partitioned boolean;
    exact boolean;
BEGIN
    h := with_traceparent(0, enqueue_one.headers, enqueue_one.traceparent);
    PERFORM enqueue_check(0, enqueue_one.aggregate_type, enqueue_one.aggregate_id, enqueue_one.event_type,
        coalesce(enqueue_one.schema_version, 1), enqueue_one.content_type, enqueue_one.payload, h,
        current_setting('outbox.max_payload_bytes')::integer);
    PERFORM enqueue_hold(jsonb_build_array(current_schema() || chr(31) || enqueue_one.aggregate_type || chr(31) || enqueue_one.aggregate_id));
    LOCK TABLE ONLY outbox_events IN ACCESS SHARE MODE; -- before the counter row, and before reading the kind (lane_bases)
    partitioned := pg_catalog.pg_get_partkeydef('outbox_events'::regclass) IS NOT NULL;
    exact := partitioned OR current_setting('transaction_isolation') <> 'read committed';
    INSERT INTO outbox_aggregates AS a (aggregate_type, aggregate_id, last_sequence)
    VALUES (enqueue_one.aggregate_type, enqueue_one.aggregate_id, 1)
    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_sequence = a.last_sequence WHERE false
    RETURNING a.parked_at INTO parked;
    IF NOT FOUND THEN -- the row existed, and is locked now: read the lane's end
        IF partitioned THEN
            SELECT a.last_sequence, a.parked_at, a.parked_through INTO last, parked, through
            FROM outbox_aggregates a
            WHERE a.aggregate_type = enqueue_one.aggregate_type AND a.aggregate_id = enqueue_one.aggregate_id;
        ELSE
            SELECT greatest(a.last_sequence, coalesce((SELECT e.aggregate_sequence FROM outbox_events e
                    WHERE e.aggregate_type = enqueue_one.aggregate_type AND e.aggregate_id = enqueue_one.aggregate_id
                    ORDER BY e.aggregate_sequence DESC LIMIT 1), 0)),
                a.parked_at, a.parked_through INTO last, parked, through
            FROM outbox_aggregates a
            WHERE a.aggregate_type = enqueue_one.aggregate_type AND a.aggregate_id = enqueue_one.aggregate_id;
        END IF;
        seq := last + 1;
        IF exact OR through = last THEN
            UPDATE outbox_aggregates a SET
                last_sequence = CASE WHEN exact THEN seq ELSE a.last_sequence END,
                parked_through = CASE WHEN a.parked_through = last THEN seq ELSE a.parked_through END
            WHERE a.aggregate_type = enqueue_one.aggregate_type AND a.aggregate_id = enqueue_one.aggregate_id;
        END IF;
    END IF;
    RETURN QUERY
    INSERT INTO outbox_events AS e (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type,
        schema_version, payload_bytes, headers, content_type, available_at)
    VALUES (eid, enqueue_one.aggregate_type, enqueue_one.aggregate_id, seq, enqueue_one.event_type,
        CASE WHEN coalesce(enqueue_one.schema_version, 0) = 0 THEN 1 ELSE enqueue_one.schema_version END,
        coalesce(enqueue_one.payload, ''::bytea), coalesce(h, '{}'::jsonb),
        CASE WHEN enqueue_one.content_type = '' OR enqueue_one.content_type = 'application/json' THEN NULL ELSE enqueue_one.content_type END,
        CASE WHEN parked IS NULL THEN now() ELSE 'infinity'::timestamptz END)
    RETURNING e.event_id, e.aggregate_sequence, e.occurred_at;
END
$fn$;

CREATE OR REPLACE FUNCTION enqueue_many(events jsonb)
RETURNS TABLE (event_id uuid, sequence bigint, occurred_at timestamptz)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER
SET search_path FROM CURRENT
SET outbox.max_payload_bytes = '1048576'
AS $fn$
#variable_conflict use_column
DECLARE
    ev jsonb;
    i integer := 0;
    max_payload integer := current_setting('outbox.max_payload_bytes')::integer;
    input_rows jsonb := '[]';
    keys jsonb := '[]';
    held text;
    eid uuid;
    ids jsonb := '{}';
    h jsonb;
    p bytea;
    sv integer;
    lane_types text[];
    lane_ids text[];
    lane_counts integer[];
BEGIN
    IF jsonb_typeof(events) <> 'array' OR jsonb_array_length(events) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'events',
            MESSAGE = 'invalid event: no events given (events must be a non-empty JSON array)';
    END IF;
    FOR ev IN SELECT value FROM jsonb_array_elements(events) LOOP
        IF jsonb_typeof(ev) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'events',
                MESSAGE = format('invalid event %s: not a JSON object', i);
        END IF;
        IF ev ? 'payload_base64' THEN
            p := many_payload(i, ev -> 'payload_base64');
        ELSIF ev ? 'payload' AND jsonb_typeof(ev -> 'payload') IS NOT NULL THEN
            p := convert_to((ev -> 'payload')::text, 'UTF8');
        ELSE
            p := NULL;
        END IF;
        h := with_traceparent(i, nullif(ev -> 'headers', 'null'::jsonb), ev ->> 'traceparent');
        sv := many_schema_version(i, ev -> 'schema_version');
        PERFORM enqueue_check(i, ev ->> 'aggregate_type', ev ->> 'aggregate_id', ev ->> 'event_type',
            sv, ev ->> 'content_type', p, h, max_payload);
        eid := many_event_id(i, ev -> 'event_id');
        IF ids ? eid::text THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'event_id',
                MESSAGE = format('invalid event %s: event id %s given twice', i, eid);
        END IF;
        ids := ids || jsonb_build_object(eid::text, true);
        held := current_schema() || chr(31) || (ev ->> 'aggregate_type') || chr(31) || (ev ->> 'aggregate_id');
        IF NOT keys ? held THEN
            keys := keys || to_jsonb(held);
        END IF;
        input_rows := input_rows || jsonb_build_object('ord', i, 'event_id', eid,
            'aggregate_type', ev ->> 'aggregate_type', 'aggregate_id', ev ->> 'aggregate_id',
            'event_type', ev ->> 'event_type',
            'schema_version', CASE WHEN sv = 0 THEN 1 ELSE sv END,
            'content_type', CASE WHEN ev ->> 'content_type' IN ('', 'application/json') THEN NULL ELSE ev ->> 'content_type' END,
            'payload', encode(p, 'base64'), 'headers', coalesce(h, '{}'::jsonb));
        i := i + 1;
    END LOOP;
    PERFORM enqueue_hold(keys);
    SELECT array_agg(r.aggregate_type ORDER BY r.aggregate_type, r.aggregate_id),
           array_agg(r.aggregate_id ORDER BY r.aggregate_type, r.aggregate_id),
           array_agg(r.n ORDER BY r.aggregate_type, r.aggregate_id)
    INTO lane_types, lane_ids, lane_counts
    FROM (SELECT r.aggregate_type, r.aggregate_id, count(*)::integer AS n
          FROM jsonb_to_recordset(input_rows) AS r(aggregate_type text, aggregate_id text)
          GROUP BY r.aggregate_type, r.aggregate_id) r;
    RETURN QUERY
    WITH input AS (
        SELECT * FROM jsonb_to_recordset(input_rows) AS r(
            ord int, event_id uuid, aggregate_type text, aggregate_id text,
            event_type text, schema_version int, content_type text, payload text, headers jsonb)
    ), seq AS MATERIALIZED (
        SELECT * FROM lane_bases(lane_types, lane_ids, lane_counts)
    ), ins AS (
        INSERT INTO outbox_events AS e (event_id, aggregate_type, aggregate_id,
            aggregate_sequence, event_type, schema_version, content_type, payload_bytes, headers, available_at)
        SELECT i.event_id, i.aggregate_type, i.aggregate_id,
            s.base + row_number() OVER (PARTITION BY i.aggregate_type, i.aggregate_id ORDER BY i.ord),
            i.event_type, i.schema_version, i.content_type, decode(coalesce(i.payload, ''), 'base64'), i.headers,
            CASE WHEN s.parked_at IS NULL THEN now() ELSE 'infinity'::timestamptz END
        FROM input i
        JOIN seq s USING (aggregate_type, aggregate_id)
        ORDER BY i.ord -- rows stored in the events' order, as ids (UUIDv7) grow: the planner's correlation
        RETURNING e.event_id, e.aggregate_sequence, e.occurred_at
    )
    SELECT ins.event_id, ins.aggregate_sequence, ins.occurred_at
    FROM ins JOIN input USING (event_id) ORDER BY input.ord;
END
$fn$;

-- cleanup_events (migration 018) deletes settled events past the replay
-- horizon. Since the counter row is a floor, clean-up keeps it at or above
-- every sequence it deletes: before deleting a lane's events it raises the
-- floor to the highest of them, taking the counter row with SKIP LOCKED (a
-- lane whose row a writer holds keeps its events until the next clean-up).
-- Raised for every deletion, not only of a lane's last event: a
-- REPEATABLE READ writer whose snapshot predates the events deleted
-- cannot see them, nor the later ones; the raise is a new version of the
-- row, which its lock step then refuses (40001), where it would have
-- written a deleted number again behind later events. A lane without a
-- counter row (events written by hand) is cleaned as before 020.
CREATE OR REPLACE FUNCTION cleanup_events(older_than interval, batch integer) RETURNS bigint
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER
SET search_path FROM CURRENT
AS $fn$
WITH cand AS MATERIALIZED (
    SELECT e.ctid AS row_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence FROM outbox_events e
    WHERE (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = 'outbox_events'::regclass) = 'r'
      AND e.published_at IS NOT NULL AND e.published_at < now() - older_than
      AND (e.skipped_at IS NULL OR (
        lane_last(e.aggregate_type, e.aggregate_id) > e.aggregate_sequence
        AND NOT EXISTS (SELECT 1 FROM outbox_events n
            WHERE n.aggregate_type = e.aggregate_type AND n.aggregate_id = e.aggregate_id
              AND n.aggregate_sequence = e.aggregate_sequence + 1)))
    ORDER BY e.published_at
    LIMIT batch
    FOR UPDATE SKIP LOCKED
), lanes AS MATERIALIZED (
    SELECT c.aggregate_type, c.aggregate_id, max(c.aggregate_sequence) AS top FROM cand c
    GROUP BY c.aggregate_type, c.aggregate_id
), need AS MATERIALIZED (
    -- lanes whose counter row's floor is below the highest sequence deleted
    SELECT l.* FROM lanes l
    JOIN outbox_aggregates a ON a.aggregate_type = l.aggregate_type AND a.aggregate_id = l.aggregate_id
    WHERE a.last_sequence < l.top
), taken AS MATERIALIZED (
    SELECT a.aggregate_type, a.aggregate_id, n.top FROM outbox_aggregates a
    JOIN need n ON n.aggregate_type = a.aggregate_type AND n.aggregate_id = a.aggregate_id
    FOR UPDATE OF a SKIP LOCKED
), raised AS (
    UPDATE outbox_aggregates a SET last_sequence = t.top
    FROM taken t
    WHERE a.aggregate_type = t.aggregate_type AND a.aggregate_id = t.aggregate_id AND a.last_sequence < t.top
), gone AS (
    DELETE FROM outbox_events WHERE ctid = ANY (ARRAY(
        SELECT c.row_id FROM cand c
        WHERE NOT EXISTS (SELECT 1 FROM need n
                WHERE n.aggregate_type = c.aggregate_type AND n.aggregate_id = c.aggregate_id)
           OR EXISTS (SELECT 1 FROM taken t
                WHERE t.aggregate_type = c.aggregate_type AND t.aggregate_id = c.aggregate_id)))
    RETURNING 1
)
SELECT count(*) FROM gone
$fn$;

REVOKE ALL ON FUNCTION lane_bases(text[], text[], integer[]) FROM PUBLIC;

DO $do$
BEGIN
    IF current_setting('outbox.migrate_limit_many') <> '1048576' THEN
        EXECUTE format('ALTER FUNCTION enqueue_many(jsonb) SET outbox.max_payload_bytes = %L',
            current_setting('outbox.migrate_limit_many'));
    END IF;
END
$do$;

SELECT set_config('search_path', format('%I', current_schema()), true);
