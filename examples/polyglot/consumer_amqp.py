"""Consumes the outbox's CloudEvents from a RabbitMQ queue with Debian's
python3-pika and applies each event once and in per-aggregate order through
the SQL inbox (outbox.inbox_claim), with python3-psycopg.

    DATABASE_URL=postgres://... AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2F \\
      OUTBOX_SCHEMA=outbox python3 consumer_amqp.py QUEUE CONSUMER EXPECTED

The attributes are AMQP application properties, "cloudEvents:" + name, and
the event's own headers (traceparent) plain ones; the content type is the
message's property. Stops after EXPECTED events were applied and prints
one JSON line.
"""
import json
import os
import re
import sys
import uuid
from datetime import datetime

import pika
import psycopg
from psycopg import sql

TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def text(value) -> str:
    """An application property as a string (pika gives bytes for some)."""
    return value.decode() if isinstance(value, bytes) else str(value or "")


def rfc3339(value: str) -> bool:
    try:  # at most 6 fractional digits for datetime; PostgreSQL keeps microseconds
        datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", value).replace("Z", "+00:00"))
        return True
    except ValueError:
        return False


def is_uuid(value: str) -> bool:
    try:
        return uuid.UUID(value) is not None
    except ValueError:
        return False


def main() -> None:
    queue, consumer, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
    schema = sql.Identifier(os.environ.get("OUTBOX_SCHEMA", "outbox"))
    claim = sql.SQL("SELECT {}.inbox_claim(%s, %s, %s, %s, %s, skipped_from => %s, occurred_at => %s)").format(schema)
    effect = sql.SQL("INSERT INTO {}.polyglot_effects VALUES (%s, %s, %s, %s, %s)").format(schema)
    seen = {"apply": 0, "duplicate": 0, "early": 0, "out_of_order": 0, "bad": [],
            "source": set(), "type": set(), "datacontenttype": set(), "traceparent": set()}
    last = {}  # aggregate -> last sequence applied
    db = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    db.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {}.polyglot_effects (consumer text, event_id uuid, aggregate_id text, sequence bigint, type text)").format(schema))
    amqp = pika.BlockingConnection(pika.URLParameters(os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")))
    channel = amqp.channel()
    channel.basic_qos(prefetch_count=64)
    for method, props, body in channel.consume(queue):
        h = props.headers or {}
        a = {name: text(h.get("cloudEvents:" + name)) for name in
             ("specversion", "id", "source", "type", "subject", "time", "aggregatetype", "sequence", "skippedfrom")}
        traceparent = text(h.get("traceparent"))
        for name, ok in (("specversion", a["specversion"] == "1.0"), ("id", props.message_id == a["id"] and is_uuid(a["id"])),
                         ("source", a["source"] != ""), ("type", a["type"] == props.type != ""), ("subject", a["subject"] != ""),
                         ("time", rfc3339(a["time"])), ("sequence", re.fullmatch(r"\d{20}", a["sequence"])),
                         ("datacontenttype", props.content_type == "application/json" and json.loads(body) is not None),
                         ("traceparent", TRACEPARENT.match(traceparent))):
            if not ok:
                seen["bad"].append(f"{a['id']}: {name}")
        for name in ("source", "type"):
            seen[name].add(a[name])
        seen["datacontenttype"].add(props.content_type)
        seen["traceparent"].add(traceparent)
        agg, seq = a["subject"], int(a["sequence"])  # AMQP has no partition key: the aggregate id is the subject
        try:
            with db.transaction():  # the claim and the effect commit together
                answer = db.execute(claim, (consumer, a["id"], a["aggregatetype"], agg, seq,
                                            int(a["skippedfrom"] or 0), a["time"])).fetchone()[0]
                if answer == "apply":
                    db.execute(effect, (consumer, a["id"], agg, seq, a["type"]))
        except psycopg.Error as err:
            channel.basic_nack(method.delivery_tag, requeue=True)
            print(err, file=sys.stderr)
            continue
        seen[answer] += 1
        if answer == "apply":
            seen["out_of_order"] += last.get(agg, 0) + 1 != seq
            last[agg] = seq
        if answer == "early":  # after the commit: redelivered later
            channel.basic_nack(method.delivery_tag, requeue=True)
        else:
            channel.basic_ack(method.delivery_tag)
        if seen["apply"] >= expected:
            break
    channel.cancel()  # what was not acked goes back to the queue
    amqp.close()
    db.close()
    print(json.dumps({k: sorted(v) if isinstance(v, set) else v for k, v in seen.items()}))


if __name__ == "__main__":
    main()
