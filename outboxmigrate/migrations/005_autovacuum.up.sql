-- outbox 005: per-table autovacuum and fillfactor for the tables that churn.
--
-- Upgrading a large table: ALTER TABLE ... SET (storage parameters) is a
-- catalogue change. It takes a SHARE UPDATE EXCLUSIVE lock, which does not
-- block reads, inserts, updates or deletes (it conflicts only with VACUUM,
-- ANALYZE, CREATE INDEX CONCURRENTLY and other ALTERs of the same kind; a
-- running autovacuum of the table is cancelled, a manual VACUUM is waited
-- for), and it rewrites nothing. fillfactor in particular applies only to
-- rows inserted from now on: pages already full stay as they are until
-- clean-up and vacuum empty them and inserts fill them again. Nothing here
-- needs VACUUM FULL or a rewrite.
--
-- The server decides whether autovacuum runs at all: with autovacuum = off
-- in postgresql.conf these settings do nothing (only the anti-wraparound
-- vacuum still starts), and dead rows are removed only by page pruning and
-- by a manual VACUUM. docs/operations.md ("Autovacuum") has the server
-- settings to go with these, what to monitor, and what the soak benchmark
-- measured with and without them.
--
-- The defaults being overridden (PostgreSQL 13+): vacuum a table when its
-- dead rows exceed 50 + 20% of its rows, vacuum for inserts past
-- 1000 + 20%, analyze past 50 + 10% of rows changed, at a cost limit of 200
-- per 2 ms. A 20% trigger is wrong for a queue: the rows that matter (the
-- unpublished few at the head of outbox_dispatch_idx) are a tiny fraction of
-- a table that keeps hours or days of published events for replay, so
-- 20% of that table in dead rows is millions of dead index entries for the
-- relay's claim to step over before autovacuum even starts.

-- outbox_events: every row is inserted, updated when a relay claims it
-- (claimed_by, claim_token, claim_until: no index covers them, so the new
-- version can stay on the page as a HOT update), updated again when it is
-- marked published (published_at is in the partial indexes' predicates, so
-- that update is never HOT), and deleted by clean-up. That is about three
-- dead row versions per event.
--
--   fillfactor = 80: inserts stop at 80% of a page, leaving ~1.6 kB, four
--     or five versions of a ~0.35 kB row (an event with a 200-byte
--     payload), for claim updates to stay on the page: a HOT update writes
--     no entry in any of the table's seven indexes, and its dead version is
--     removed by page pruning without waiting for vacuum. The cost is up to
--     25% more heap pages for the retained history. In the soak (bench
--     --only soak, autovacuum on) 47-49% of all updates were HOT, of a
--     possible 50%: nearly every claim update stayed on its page.
--   autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold =
--     10000: vacuum after 10,000 dead rows plus 1% of the table, instead of
--     20%. At 1,000 events/s that is a vacuum every few seconds' worth of
--     churn on a small table (autovacuum_naptime then paces it) and after
--     ~1% of the table on a table holding a long replay horizon. With the
--     visibility map, each run reads only the pages changed since the last
--     one, not the whole retained history.
--   autovacuum_vacuum_insert_scale_factor = 0.01,
--     autovacuum_vacuum_insert_threshold = 10000: while the relay is down
--     the table only receives inserts; vacuum them too so that the backlog's
--     pages are in the visibility map and frozen before the relay comes back.
--   autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold =
--     10000: keep the planner's picture of "few rows have published_at IS
--     NULL" fresh, so the claim keeps its index plans as the table grows
--     and shrinks.
--   autovacuum_vacuum_cost_limit = 1000: five times the default budget for
--     this table's vacuum (still paced by autovacuum_vacuum_cost_delay,
--     2 ms by default), so that a run finishes in about a fifth of the time
--     and keeps up with the churn instead of being lapped by it.
--
-- A partitioned outbox_events (outboxmigrate.Partition) has no storage of
-- its own, and PostgreSQL refuses storage parameters on it: its partitions
-- carry them (each new partition takes those of the newest one), and this
-- statement leaves the parent alone. It did not read so before the
-- partitioned outbox existed; on a plain table it does the same.
DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'outbox_events'::regclass) = 'r' THEN
        ALTER TABLE outbox_events SET (
            fillfactor = 80,
            autovacuum_vacuum_scale_factor = 0.01,
            autovacuum_vacuum_threshold = 10000,
            autovacuum_vacuum_insert_scale_factor = 0.01,
            autovacuum_vacuum_insert_threshold = 10000,
            autovacuum_analyze_scale_factor = 0.02,
            autovacuum_analyze_threshold = 10000,
            autovacuum_vacuum_cost_limit = 1000
        );
    END IF;
END $$;

-- outbox_aggregates: one small row (~60 bytes) per aggregate, updated by
-- every write to an existing aggregate (last_sequence, not indexed: HOT when
-- the page has room) and never deleted. A hot aggregate rewrites its row
-- hundreds of times a second.
--
--   fillfactor = 70: 30% of each page (~2.4 kB, ~40 versions) free for
--     HOT updates; pruning then reclaims dead versions on the page itself.
--   autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold =
--     1000: dead versions that pruning leaves (line pointers, non-HOT
--     updates when a page is full) are vacuumed after 1,000 + 2% of the
--     table, not 20% of millions of aggregates.
ALTER TABLE outbox_aggregates SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000
);

-- processed_events: one row inserted per (consumer, event) applied, never
-- updated, deleted by the inbox clean-up past its horizon. No updates, so
-- the default fillfactor (100) stays.
--
--   autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold =
--     10000: the clean-up deletes in batches of 1,000; reclaim them after
--     10,000 + 2% of the table instead of 20%.
--   autovacuum_vacuum_insert_scale_factor = 0.05,
--     autovacuum_vacuum_insert_threshold = 10000: an insert-only stretch
--     (no clean-up configured, or a long horizon) still gets its pages into
--     the visibility map and frozen in small steps rather than in one large
--     anti-wraparound vacuum.
ALTER TABLE processed_events SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_vacuum_insert_threshold = 10000
);

-- inbox_aggregates: one row per (consumer, aggregate), its high-water mark
-- updated by every event applied (last_sequence, updated_at: not indexed,
-- and the apply path leaves the indexed waiting_since NULL, so HOT when the
-- page has room). Same shape as outbox_aggregates, same settings.
ALTER TABLE inbox_aggregates SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000
);

-- outbox_relays (a heartbeat row per relay) and outbox_operations (an audit
-- log) are small or append-only: the defaults suit them.
