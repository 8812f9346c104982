-- Writes orders and their events through the outbox's SQL write API with
-- nothing but psql: the orders and their events commit together, a
-- transaction that rolls back leaves no event, and outbox.wake() runs after
-- the commits.
--
--   psql "$DATABASE_URL" -X -q -At -v schema=outbox -v orders=20 -f writer.sql
--
-- Each order gets OrderPlaced (sequence 1) in the first transaction and
-- OrderPaid (sequence 2) in the third; the second, which cancels the first
-- order, rolls back. The last line printed is one JSON object:
-- {"written": [[event id, order id, sequence], ...], "rolled_back": [event id]}.
\set ON_ERROR_STOP on
\set traceparent '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'

CREATE TABLE IF NOT EXISTS :"schema".polyglot_orders (id text PRIMARY KEY, status text NOT NULL);

-- 1. The orders and their OrderPlaced events, in one transaction. One
-- enqueue_many call for all of them: it locks the aggregates' counter rows
-- in a fixed order, and returns its rows in the array's order (ordinality).
BEGIN;
CREATE TEMP TABLE new_orders ON COMMIT DROP AS
  SELECT gen_random_uuid()::text AS id, n FROM generate_series(1, :orders) AS n;
INSERT INTO :"schema".polyglot_orders SELECT id, 'placed' FROM new_orders;
WITH events AS (
  SELECT jsonb_agg(jsonb_build_object('aggregate_type', 'order', 'aggregate_id', id, 'event_type', 'OrderPlaced',
           'payload', jsonb_build_object('order_id', id, 'total_cents', 100 + n),
           'traceparent', :'traceparent') ORDER BY n) AS a,
         array_agg(id ORDER BY n) AS ids
  FROM new_orders)
SELECT jsonb_agg(jsonb_build_array(e.event_id, events.ids[e.n], e.sequence) ORDER BY e.n) AS placed
FROM events, :"schema".enqueue_many(events.a) WITH ORDINALITY AS e(event_id, sequence, occurred_at, n)
\gset
COMMIT;

-- 2. A transaction that rolls back after its enqueue: its event must never
-- be published. (psql keeps the variable \gset stored.)
BEGIN;
UPDATE :"schema".polyglot_orders SET status = 'cancelled' WHERE id = (:'placed'::jsonb -> 0 ->> 1);
SELECT event_id AS cancelled FROM :"schema".enqueue('order', :'placed'::jsonb -> 0 ->> 1, 'OrderCancelled', '{}') \gset
ROLLBACK;

-- 3. Every order paid, its OrderPaid event in the same transaction.
BEGIN;
UPDATE :"schema".polyglot_orders SET status = 'paid' WHERE status = 'placed';
WITH orders AS (SELECT p ->> 1 AS id, ord FROM jsonb_array_elements(:'placed'::jsonb) WITH ORDINALITY AS x(p, ord))
SELECT jsonb_agg(jsonb_build_array(e.event_id, o.id, e.sequence) ORDER BY e.n) AS paid
FROM (SELECT jsonb_agg(jsonb_build_object('aggregate_type', 'order', 'aggregate_id', id, 'event_type', 'OrderPaid',
        'payload', jsonb_build_object('order_id', id), 'traceparent', :'traceparent') ORDER BY ord) AS a FROM orders) events,
     :"schema".enqueue_many(events.a) WITH ORDINALITY AS e(event_id, sequence, occurred_at, n)
JOIN orders o ON o.ord = e.n
\gset
COMMIT;

-- After the commits: the relays look now rather than at their next poll.
SELECT :"schema".wake() \g /dev/null

SELECT jsonb_build_object('written', :'placed'::jsonb || :'paid'::jsonb, 'rolled_back', jsonb_build_array(:'cancelled'));
