// Consumes the outbox's CloudEvents from a NATS JetStream stream with the
// official nats.js client and applies each event once and in per-aggregate
// order through the SQL inbox (outbox.inbox_claim), with the npm pg client.
//
//   DATABASE_URL=... NATS_URL=nats://127.0.0.1:4222 OUTBOX_SCHEMA=outbox \
//     node consumer.js STREAM CONSUMER EXPECTED
//
// Stops after EXPECTED events were applied and prints one JSON line.
'use strict';
const { connect, AckPolicy } = require('nats');
const { Client } = require('pg');

const [stream, consumer, expected] = [process.argv[2], process.argv[3], Number(process.argv[4])];
const schema = process.env.OUTBOX_SCHEMA || 'outbox';
const q = (name) => '"' + schema.replace(/"/g, '""') + '".' + name;
// CloudEvents header values are percent-encoded where needed.
const attr = (m, name) => { const v = m.headers && m.headers.get('ce-' + name); return v ? decodeURIComponent(v) : ''; };

async function main() {
  const db = new Client({ connectionString: process.env.DATABASE_URL });
  await db.connect();
  await db.query(`CREATE TABLE IF NOT EXISTS ${q('polyglot_effects')} (consumer text, event_id uuid, aggregate_id text, sequence bigint, type text)`);
  const nc = await connect({ servers: process.env.NATS_URL || 'nats://127.0.0.1:4222' });
  const jsm = await nc.jetstreamManager();
  await jsm.consumers.add(stream, { durable_name: consumer, ack_policy: AckPolicy.Explicit, ack_wait: 30e9 });
  const messages = await (await nc.jetstream().consumers.get(stream, consumer)).consume({ max_messages: 64 });
  const seen = { apply: 0, duplicate: 0, early: 0, out_of_order: 0, bad: [] }; // answers of inbox_claim
  const last = new Map(); // aggregate -> last sequence applied
  for await (const m of messages) {
    const [id, aggType, aggID, seq] = [attr(m, 'id'), attr(m, 'aggregatetype'), attr(m, 'subject'), Number(attr(m, 'sequence'))];
    for (const [name, ok] of [['specversion', attr(m, 'specversion') === '1.0'], ['source', attr(m, 'source') !== ''],
      ['type', attr(m, 'type') !== ''], ['time', !isNaN(Date.parse(attr(m, 'time')))], ['partitionkey', attr(m, 'partitionkey') === aggID],
      ['sequence', /^\d{20}$/.test(attr(m, 'sequence'))], ['content-type', m.headers.get('content-type') === 'application/json']]) {
      if (!ok) seen.bad.push(`${id}: ${name}`);
    }
    await db.query('BEGIN');
    try {
      const { rows } = await db.query(`SELECT ${q('inbox_claim')}($1, $2, $3, $4, $5, skipped_from => $6, occurred_at => $7) AS answer`,
        [consumer, id, aggType, aggID, seq, Number(attr(m, 'skippedfrom') || 0), attr(m, 'time')]);
      const answer = rows[0].answer;
      if (answer === 'apply') { // the effect, in the inbox's transaction
        await db.query(`INSERT INTO ${q('polyglot_effects')} VALUES ($1, $2, $3, $4, $5)`, [consumer, id, aggID, seq, attr(m, 'type')]);
        if ((last.get(aggID) || 0) + 1 !== seq) seen.out_of_order++;
        last.set(aggID, seq);
      }
      await db.query('COMMIT');
      seen[answer]++;
      if (answer === 'early') m.nak(200); else m.ack(); // after the commit
    } catch (err) {
      await db.query('ROLLBACK');
      m.nak(500);
      console.error(err.message);
    }
    if (seen.apply >= expected) break;
  }
  console.log(JSON.stringify(seen));
  messages.stop(); // stop pulling; what was not acked is redelivered to the next run
  await nc.close();
  await db.end();
}

main().catch((err) => { console.error(err); process.exit(1); });
