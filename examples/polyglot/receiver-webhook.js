// Receives the outbox's webhook deliveries (outboxwebhook, structured mode:
// one signed application/cloudevents+json body) with node:http, verifies
// each with the npm standardwebhooks package, decodes it with the npm
// cloudevents package's HTTP binding (HTTP.toEvent), and applies each event
// once and in per-aggregate order through the SQL inbox (inbox.js, npm pg).
//
//   DATABASE_URL=... OUTBOX_SCHEMA=outbox OUTBOX_WEBHOOK_SECRET=whsec_... \
//     node receiver-webhook.js CONSUMER EXPECTED [PORT]
//
// Prints {"listening":PORT} once it listens (PORT 0 or none: any free port),
// then, after EXPECTED events were applied, one JSON line, and exits.
// Answers 204 once the inbox transaction committed, 401 for a bad signature,
// timestamp or webhook-id, 400 for a body that is not a CloudEvent, 500 (the
// relay retries) for an early event or a failed transaction.
'use strict';
const http = require('node:http');
const { Webhook } = require('standardwebhooks');
const { HTTP } = require('cloudevents');
const inbox = require('./inbox');

const [consumer, expected, port] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4] || 0)];
const webhook = new Webhook(process.env.OUTBOX_WEBHOOK_SECRET); // never printed

async function handle(box, req, body) {
  try {
    webhook.verify(body, req.headers); // signature over id.timestamp.body, and the timestamp's age
  } catch (err) {
    box.seen.refused++;
    return 401;
  }
  let ce;
  try {
    ce = HTTP.toEvent({ headers: req.headers, body: body.toString('utf8') });
  } catch (err) {
    box.seen.bad.push(`undecodable: ${err.message}`);
    return 400;
  }
  if (req.headers['webhook-id'] !== ce.id) { box.seen.refused++; return 401; } // the signed id is the event's
  try { ce.validate(); } catch (err) { box.seen.bad.push(`${ce.id}: cloudevents validate: ${err.message}`); }
  // The event's own headers, signed: a JSON object in the outboxheaders extension.
  const own = ce.outboxheaders ? JSON.parse(ce.outboxheaders) : {};
  // time from the signed body itself: toEvent keeps only its milliseconds.
  const ev = { ...ce, data: JSON.stringify(ce.data), traceparent: own.traceparent, time: JSON.parse(body).time };
  try {
    return (await box.claim(ev)) === 'early' ? 500 : 204;
  } catch (err) {
    console.error(err.message);
    return 500;
  }
}

async function main() {
  const box = await inbox.open(consumer);
  box.seen.refused = 0;
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      res.writeHead(await handle(box, req, Buffer.concat(chunks))).end();
      if (box.seen.apply >= expected && server.listening) {
        server.close();
        server.closeAllConnections(); // the relay keeps its connections alive
        console.log(JSON.stringify(box.seen));
        await box.end();
      }
    });
  });
  server.listen(port, '127.0.0.1', () => console.log(JSON.stringify({ listening: server.address().port })));
}

main().catch((err) => { console.error(err); process.exit(1); });
