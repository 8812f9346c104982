"""Writes orders and their events in one transaction each, through the
outbox's SQL write API (outbox.enqueue), with Debian's python3-psycopg.

    DATABASE_URL=postgres://... OUTBOX_SCHEMA=outbox python3 writer.py ORDERS

Each order gets two events, OrderPlaced then OrderPaid (sequences 1 and 2 of
aggregate order/<id>); every 10th transaction is rolled back after its
enqueue, so its event must never be published. Prints one JSON line.
"""
import json
import os
import sys
import uuid

import psycopg
from psycopg import sql


def main() -> None:
    orders = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    schema = os.environ.get("OUTBOX_SCHEMA", "outbox")
    enqueue = sql.SQL("SELECT event_id, sequence FROM {}.enqueue(%s, %s, %s, %s::text)").format(sql.Identifier(schema))
    wake = sql.SQL("SELECT {}.wake()").format(sql.Identifier(schema))
    written, rolled_back = [], []
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {}.polyglot_orders (id text PRIMARY KEY, status text NOT NULL)")
                     .format(sql.Identifier(schema)))
        conn.commit()
        for n in range(orders):
            order_id = str(uuid.uuid4())
            with conn.transaction():  # the order and its first event commit together
                conn.execute(sql.SQL("INSERT INTO {}.polyglot_orders VALUES (%s, 'placed')").format(sql.Identifier(schema)), (order_id,))
                placed = json.dumps({"order_id": order_id, "total_cents": 100 + n})
                event_id, seq = conn.execute(enqueue, ("order", order_id, "OrderPlaced", placed)).fetchone()
                written.append([str(event_id), order_id, seq])
            if n % 10 == 9:  # a transaction that rolls back: its event must never be published
                try:
                    with conn.transaction():
                        row = conn.execute(enqueue, ("order", order_id, "OrderCancelled", "{}")).fetchone()
                        rolled_back.append(str(row[0]))
                        raise RuntimeError("roll back")
                except RuntimeError:
                    pass
            with conn.transaction():
                conn.execute(sql.SQL("UPDATE {}.polyglot_orders SET status = 'paid' WHERE id = %s").format(sql.Identifier(schema)), (order_id,))
                event_id, seq = conn.execute(enqueue, ("order", order_id, "OrderPaid", json.dumps({"order_id": order_id}))).fetchone()
                written.append([str(event_id), order_id, seq])
            conn.execute(wake)  # after commit: the relays look now instead of at their next poll
            conn.commit()
    print(json.dumps({"written": written, "rolled_back": rolled_back}))


if __name__ == "__main__":
    main()
