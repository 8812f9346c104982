-- outbox 009: a claim that does not read settled history.
--
-- Every claim used to walk outbox_dispatch_idx from its start. An event
-- leaves that partial index when it is marked published, but its old index
-- entry can only be removed once no transaction might still see the row:
-- while one transaction stays open (a forgotten psql session, a long report,
-- a migration), every event published since it began leaves an entry that
-- each claim steps over, reading its heap page to learn that the row is no
-- longer pending. At 800 events/s, ten minutes of an open transaction made
-- each claim read 480,000 of them. docs/design.md, "Claiming only what is
-- new", has the argument and the measurements.
--
-- dispatch_xid is the id of the transaction that wrote the event
-- (pg_current_xact_id(), the top-level transaction id, which the writer has
-- anyway since it inserts). A relay remembers the snapshot of its last claim
-- and next reads only the events of transactions that were still running
-- then or started since: a range scan of outbox_fresh_idx from that
-- snapshot's xmax, plus a lookup of each transaction that was in progress
-- in it. Transactions commit in any order, but a transaction that is not
-- visible in a snapshot is either in its list of running transactions or
-- at or past its xmax, so no late commit is missed, however long the
-- writer's transaction lasted.
--
-- An event as written has available_at = occurred_at exactly (both the
-- writer's now()); outbox_fresh_idx holds only those. Every other pending
-- event is scheduled: available_at <> occurred_at, in outbox_rescheduled_idx.
-- A failed publish's backoff, an operator's retry, a lane unparked, events
-- released unsent: each sets available_at to a moment of its own (never
-- derived from occurred_at, which a writer may have set from a clock ahead
-- of the database's), and so moves the event from the one index to the
-- other; so does a row written by hand with an available_at of its own,
-- earlier or later than its occurred_at. Scheduled events become claimable
-- with time or an action, not with a commit; a claim reads those that are
-- due from this index, which holds only them.
--
-- Upgrading a large table: the column is nullable, and its default is set
-- after it is added, so existing rows keep NULL and nothing is rewritten
-- (a catalogue change each). Rows with a NULL dispatch_xid are claimed by
-- the relay's periodic full scan (RelayConfig.RescanInterval), as every row
-- was before. The two indexes are partial but CREATE INDEX still reads the
-- whole table while it blocks writes to it: on a big outbox_events, create
-- them first with CREATE INDEX CONCURRENTLY (same names and definitions,
-- outside a transaction); this file then finds them and does nothing more.
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS dispatch_xid xid8;
ALTER TABLE outbox_events ALTER COLUMN dispatch_xid SET DEFAULT pg_current_xact_id();

-- The predicates name dispatch_xid IS NOT NULL, available_at = occurred_at
-- and available_at <> occurred_at although the statements that read these
-- indexes say more: a statement that does not state them cannot use the
-- index. The claim's
-- other lookups (a lane's predecessor, its successors) then cannot be
-- planned on outbox_fresh_idx, whose predicate they would otherwise imply,
-- as a scan of every pending event.
CREATE INDEX IF NOT EXISTS outbox_fresh_idx
    ON outbox_events (dispatch_xid)
    WHERE published_at IS NULL AND quarantined_at IS NULL AND dispatch_xid IS NOT NULL
      AND available_at = occurred_at;

CREATE INDEX IF NOT EXISTS outbox_rescheduled_idx
    ON outbox_events (available_at)
    WHERE published_at IS NULL AND quarantined_at IS NULL
      AND available_at <> occurred_at AND available_at < 'infinity';
