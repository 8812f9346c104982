// Writes orders and their events in one transaction each, through the
// outbox's SQL write API (outbox.enqueue), with the npm pg client.
//
//   DATABASE_URL=postgres://... OUTBOX_SCHEMA=outbox node writer.js ORDERS
//
// Each order gets two events, OrderPlaced then OrderPaid (sequences 1 and 2
// of aggregate order/<id>); every 10th order also runs a transaction that
// rolls back after its enqueue, so its event must never be published.
// Prints one JSON line: {"written": [[event id, order id, sequence], ...],
// "rolled_back": [event id, ...]}.
'use strict';
const { randomUUID } = require('crypto');
const { Client } = require('pg');

const orders = Number(process.argv[2] || 10);
const schema = process.env.OUTBOX_SCHEMA || 'outbox';
const q = (name) => '"' + schema.replace(/"/g, '""') + '".' + name;
const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
const enqueue = `SELECT event_id, sequence FROM ${q('enqueue')}($1, $2, $3, $4::text, traceparent => $5)`;

// tx runs fn in a transaction: COMMIT when it returns, ROLLBACK when it throws.
async function tx(db, fn) {
  await db.query('BEGIN');
  try {
    const result = await fn();
    await db.query('COMMIT');
    return result;
  } catch (err) {
    await db.query('ROLLBACK');
    throw err;
  }
}

async function main() {
  const db = new Client({ connectionString: process.env.DATABASE_URL });
  await db.connect();
  await db.query(`CREATE TABLE IF NOT EXISTS ${q('polyglot_orders')} (id text PRIMARY KEY, status text NOT NULL)`);
  const written = [], rolledBack = [];
  const write = async (orderID, type, payload) => {
    const { rows } = await db.query(enqueue, ['order', orderID, type, JSON.stringify(payload), traceparent]);
    return [rows[0].event_id, orderID, Number(rows[0].sequence)]; // bigint arrives as a string
  };
  for (let n = 0; n < orders; n++) {
    const orderID = randomUUID();
    written.push(await tx(db, async () => { // the order and its first event commit together
      await db.query(`INSERT INTO ${q('polyglot_orders')} VALUES ($1, 'placed')`, [orderID]);
      return write(orderID, 'OrderPlaced', { order_id: orderID, total_cents: 100 + n });
    }));
    if (n % 10 === 9) { // a transaction that rolls back: its event must never be published
      const cancelled = [];
      await tx(db, async () => {
        await db.query(`UPDATE ${q('polyglot_orders')} SET status = 'cancelled' WHERE id = $1`, [orderID]);
        cancelled.push((await write(orderID, 'OrderCancelled', {}))[0]);
        throw new Error('roll back');
      }).catch((err) => { if (err.message !== 'roll back') throw err; });
      rolledBack.push(...cancelled);
    }
    written.push(await tx(db, async () => {
      await db.query(`UPDATE ${q('polyglot_orders')} SET status = 'paid' WHERE id = $1`, [orderID]);
      return write(orderID, 'OrderPaid', { order_id: orderID });
    }));
    await db.query(`SELECT ${q('wake')}()`); // after commit: the relays look now instead of at their next poll
  }
  console.log(JSON.stringify({ written, rolled_back: rolledBack }));
  await db.end();
}

main().catch((err) => { console.error(err); process.exit(1); });
