// Consumes the outbox's CloudEvents from a RabbitMQ queue bound to the
// relay's exchange with the npm amqplib client, and applies each event once
// and in per-aggregate order through the SQL inbox (inbox.js, npm pg).
//
//   DATABASE_URL=... OUTBOX_SCHEMA=outbox RABBITMQ_URL=amqp://guest:guest@127.0.0.1:5672/ \
//     node consumer-amqp.js QUEUE CONSUMER EXPECTED
//
// The AMQP binding's binary mode: the attributes are "cloudEvents:"
// application properties, the content type the message's content-type
// property, the event's own headers (traceparent) plain application
// properties. AMQP carries no partition key: the aggregate is the subject.
// Stops after EXPECTED events were applied and prints one JSON line.
'use strict';
const amqp = require('amqplib');
const inbox = require('./inbox');

const [queue, consumer, expected] = [process.argv[2], process.argv[3], Number(process.argv[4])];

async function main() {
  const box = await inbox.open(consumer);
  const conn = await amqp.connect(process.env.RABBITMQ_URL || 'amqp://guest:guest@127.0.0.1:5672/');
  const ch = await conn.createChannel();
  await ch.prefetch(16);
  let done;
  const finished = new Promise((resolve) => { done = resolve; });
  await ch.consume(queue, async (m) => {
    const p = m.properties.headers || {};
    const attr = (name) => (p['cloudEvents:' + name] === undefined ? undefined : String(p['cloudEvents:' + name]));
    const ev = {
      specversion: attr('specversion'), id: attr('id'), source: attr('source'), type: attr('type'), subject: attr('subject'),
      time: attr('time'), aggregatetype: attr('aggregatetype'), sequence: attr('sequence'), skippedfrom: attr('skippedfrom'),
      datacontenttype: m.properties.contentType, traceparent: p.traceparent && String(p.traceparent), data: m.content.toString('utf8'),
    };
    try {
      const answer = await box.claim(ev);
      if (answer === 'early') ch.nack(m, false, true); else ch.ack(m); // after the commit; early: back to the queue
    } catch (err) {
      ch.nack(m, false, true);
      console.error(err.message);
    }
    if (box.seen.apply >= expected) done();
  }, { noAck: false });
  await finished;
  console.log(JSON.stringify(box.seen));
  await conn.close(); // what was not acked goes back to the queue
  await box.end();
}

main().catch((err) => { console.error(err); process.exit(1); });
