// The SQL inbox the AMQP, Kafka and webhook consumers share: checks the
// CloudEvents attributes a consumer reads (docs/destinations.md), then calls
// outbox.inbox_claim first in the transaction that applies the effect (here:
// a row of what was received), so each event is applied once and in
// per-aggregate order (docs/sql-api.md).
'use strict';
const { Client } = require('pg');

const schema = process.env.OUTBOX_SCHEMA || 'outbox';
const q = (name) => '"' + schema.replace(/"/g, '""') + '".' + name;

// A CloudEvent's attributes as the program decoded them: id, source, type,
// subject, time, sequence, datacontenttype, aggregatetype, skippedfrom,
// partitionkey (undefined where the binding carries none), traceparent, data.
function problems(ev) {
  const bad = [];
  const check = (name, ok) => { if (!ok) bad.push(`${ev.id}: ${name}`); };
  check('specversion', ev.specversion === '1.0');
  check('id', /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/.test(ev.id));
  check('source', !!ev.source);
  check('type', !!ev.type);
  check('subject', !!ev.subject);
  check('aggregatetype', !!ev.aggregatetype);
  check('time', !isNaN(Date.parse(ev.time)));
  check('sequence', /^\d{20}$/.test(ev.sequence));
  check('datacontenttype', !!ev.datacontenttype);
  check('partitionkey', ev.partitionkey === undefined || ev.partitionkey === ev.subject);
  check('traceparent', /^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/.test(ev.traceparent || ''));
  return bad;
}

async function open(consumer) {
  const db = new Client({ connectionString: process.env.DATABASE_URL });
  await db.connect();
  await db.query(`CREATE TABLE IF NOT EXISTS ${q('polyglot_received')} (consumer text, event_id uuid, aggregate_type text,
    aggregate_id text, sequence bigint, type text, source text, time text, datacontenttype text, partitionkey text,
    traceparent text, data text, applied bigserial)`);
  const seen = { apply: 0, duplicate: 0, early: 0, out_of_order: 0, bad: [] };
  const last = new Map(); // aggregate -> last sequence applied
  let queue = Promise.resolve(); // one transaction at a time on the one connection

  // claim(ev) answers 'apply', 'duplicate' or 'early'; it throws when the
  // transaction failed (rolled back: the message must come again).
  const claim = (ev) => (queue = queue.catch(() => {}).then(async () => {
    seen.bad.push(...problems(ev));
    const seq = Number(ev.sequence);
    await db.query('BEGIN');
    try {
      const { rows } = await db.query(`SELECT ${q('inbox_claim')}($1, $2, $3, $4, $5, skipped_from => $6, occurred_at => $7) AS answer`,
        [consumer, ev.id, ev.aggregatetype, ev.subject, seq, Number(ev.skippedfrom || 0), ev.time]);
      const answer = rows[0].answer;
      if (answer === 'apply') { // the effect, in the inbox's transaction
        await db.query(`INSERT INTO ${q('polyglot_received')} VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
          [consumer, ev.id, ev.aggregatetype, ev.subject, seq, ev.type, ev.source, ev.time, ev.datacontenttype,
            ev.partitionkey ?? null, ev.traceparent ?? null, ev.data]);
        const key = ev.aggregatetype + '/' + ev.subject;
        if ((last.get(key) || 0) + 1 !== seq) seen.out_of_order++;
        last.set(key, seq);
      }
      await db.query('COMMIT');
      seen[answer]++;
      return answer;
    } catch (err) {
      await db.query('ROLLBACK');
      throw err;
    }
  }));
  return { claim, seen, end: async () => { await queue.catch(() => {}); await db.end(); } };
}

module.exports = { open };
