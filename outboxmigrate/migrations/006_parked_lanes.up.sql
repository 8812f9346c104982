-- outbox 006: parked lanes. The events waiting behind a quarantined event
-- are taken out of the relay's claim, so that they cost it nothing.
--
-- Before this version every claim walked, in outbox_dispatch_idx, every event
-- waiting behind a quarantined head, to find that none of them was a head:
-- 40,000 of them made each claim of every relay take 78 ms, a million would
-- take seconds. A parked lane's waiting events have available_at = 'infinity'
-- instead, outside the claim's range (available_at <= now()); they are still
-- unpublished, so status, metrics and clean-up see them as before.
--
-- parked_at is set on an aggregate's counter row while the lowest unpublished
-- event of the aggregate is quarantined (when the lane was parked). Writers
-- read it under the row lock they take anyway and write an event to a parked
-- lane parked. parked_through is the highest sequence known parked: the
-- relay's lane sweep parks the events above it (written by a writer that
-- does not read parked_at) and moves it up to last_sequence.
--
-- Upgrading a large table: the two columns are nullable without a default
-- (a catalogue change) and the index is partial on a column that is NULL
-- everywhere, so building it is one pass over outbox_aggregates. Lanes blocked
-- before this version are parked here by flagging their counter row only,
-- with parked_through at the quarantined event: moving their waiting events
-- out of the claim's range is left to the relays' lane sweep, in bounded
-- transactions, rather than done under this migration's lock on
-- outbox_aggregates (which holds every writer).
ALTER TABLE outbox_aggregates
    ADD COLUMN IF NOT EXISTS parked_at      timestamptz,
    ADD COLUMN IF NOT EXISTS parked_through bigint;

-- Parked lanes are few (one per quarantined head): the sweep reads this
-- nearly empty index, never the counter of every aggregate.
CREATE INDEX IF NOT EXISTS outbox_aggregates_parked_idx
    ON outbox_aggregates (aggregate_type, aggregate_id)
    WHERE parked_at IS NOT NULL;

-- Flag the lanes blocked now: an aggregate whose lowest unpublished event is
-- quarantined (outbox_quarantined_idx, then one probe of
-- outbox_pending_lane_idx per quarantined event).
UPDATE outbox_aggregates a
SET parked_at = now(), parked_through = q.aggregate_sequence
FROM outbox_events q
WHERE q.quarantined_at IS NOT NULL AND q.published_at IS NULL
  AND a.aggregate_type = q.aggregate_type AND a.aggregate_id = q.aggregate_id
  AND a.parked_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM outbox_events p
                  WHERE p.published_at IS NULL AND p.aggregate_type = q.aggregate_type
                    AND p.aggregate_id = q.aggregate_id AND p.aggregate_sequence < q.aggregate_sequence);
