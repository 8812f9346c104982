"""Consumes the outbox's CloudEvents from a Kafka topic with Debian's
python3-confluent-kafka (librdkafka) and applies each event once and in
per-aggregate order through the SQL inbox (outbox.inbox_claim), with
python3-psycopg.

    DATABASE_URL=postgres://... KAFKA_BROKERS=127.0.0.1:9092 OUTBOX_SCHEMA=outbox \\
      python3 consumer_kafka.py TOPIC CONSUMER EXPECTED

The attributes are record headers, "ce_" + name, as UTF-8; the record key
is the aggregate id (the partition key); the event's own headers
(traceparent) are headers too. The group's offsets are committed after the
inbox transaction. Stops after EXPECTED events were applied and prints one
JSON line.
"""
import json
import os
import re
import sys
import time
import uuid
from datetime import datetime

import psycopg
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql

TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def is_uuid(value: str) -> bool:
    try:
        return uuid.UUID(value) is not None
    except ValueError:
        return False


def rfc3339(value: str) -> bool:
    try:  # at most 6 fractional digits for datetime; PostgreSQL keeps microseconds
        datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", value).replace("Z", "+00:00"))
        return True
    except ValueError:
        return False


def main() -> None:
    topic, consumer, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
    schema = sql.Identifier(os.environ.get("OUTBOX_SCHEMA", "outbox"))
    claim = sql.SQL("SELECT {}.inbox_claim(%s, %s, %s, %s, %s, skipped_from => %s, occurred_at => %s)").format(schema)
    effect = sql.SQL("INSERT INTO {}.polyglot_effects VALUES (%s, %s, %s, %s, %s)").format(schema)
    seen = {"apply": 0, "duplicate": 0, "early": 0, "out_of_order": 0, "bad": [],
            "source": set(), "type": set(), "datacontenttype": set(), "traceparent": set()}
    last = {}  # aggregate -> last sequence applied
    db = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    db.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {}.polyglot_effects (consumer text, event_id uuid, aggregate_id text, sequence bigint, type text)").format(schema))
    kafka = Consumer({"bootstrap.servers": os.environ.get("KAFKA_BROKERS", "127.0.0.1:9092"), "group.id": consumer,
                      "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    kafka.subscribe([topic])
    while seen["apply"] < expected:
        m = kafka.poll(1.0)
        if m is None:
            continue
        if m.error():
            raise RuntimeError(m.error())
        h = {k: v.decode() for k, v in m.headers() or []}
        a = {name: h.get("ce_" + name, "") for name in
             ("specversion", "id", "source", "type", "subject", "time", "aggregatetype", "sequence", "skippedfrom")}
        key = (m.key() or b"").decode()
        for name, ok in (("specversion", a["specversion"] == "1.0"), ("id", is_uuid(a["id"])), ("source", a["source"] != ""),
                         ("type", a["type"] != ""), ("subject", a["subject"] != ""), ("partitionkey", key == a["subject"]),
                         ("time", rfc3339(a["time"])), ("sequence", re.fullmatch(r"\d{20}", a["sequence"])),
                         ("datacontenttype", h.get("content-type") == "application/json" and json.loads(m.value()) is not None),
                         ("traceparent", TRACEPARENT.match(h.get("traceparent", "")))):
            if not ok:
                seen["bad"].append(f"{a['id']}: {name}")
        for name in ("source", "type"):
            seen[name].add(a[name])
        seen["datacontenttype"].add(h.get("content-type", ""))
        seen["traceparent"].add(h.get("traceparent", ""))
        agg, seq = key, int(a["sequence"])
        try:
            with db.transaction():  # the claim and the effect commit together
                answer = db.execute(claim, (consumer, a["id"], a["aggregatetype"], agg, seq,
                                            int(a["skippedfrom"] or 0), a["time"])).fetchone()[0]
                if answer == "apply":
                    db.execute(effect, (consumer, a["id"], agg, seq, a["type"]))
        except psycopg.Error as err:
            answer = "error"
            print(err, file=sys.stderr)
        if answer in ("early", "error"):  # read it again later: back to its offset
            time.sleep(0.2)
            kafka.seek(TopicPartition(m.topic(), m.partition(), m.offset()))
            if answer == "early":
                seen["early"] += 1
            continue
        seen[answer] += 1
        if answer == "apply":
            seen["out_of_order"] += last.get(agg, 0) + 1 != seq
            last[agg] = seq
        kafka.commit(message=m, asynchronous=False)  # after the inbox transaction
    kafka.close()
    db.close()
    print(json.dumps({k: sorted(v) if isinstance(v, set) else v for k, v in seen.items()}))


if __name__ == "__main__":
    main()
