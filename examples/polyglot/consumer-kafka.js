// Consumes the outbox's CloudEvents from a Kafka topic with the npm kafkajs
// client, decodes each record with the npm cloudevents package's Kafka
// binding (Kafka.toEvent), and applies each event once and in per-aggregate
// order through the SQL inbox (inbox.js, npm pg).
//
//   DATABASE_URL=... OUTBOX_SCHEMA=outbox KAFKA_BROKERS=127.0.0.1:9092 \
//     node consumer-kafka.js TOPIC CONSUMER EXPECTED
//
// The Kafka binding's binary mode: ce_ headers, content-type, the record key
// (the aggregate id) as the partitionkey extension, the event's own headers
// (traceparent) as plain record headers. The consumer group is CONSUMER;
// offsets are committed after the inbox transaction. Stops after EXPECTED
// events were applied and prints one JSON line.
'use strict';
const { Kafka: KafkaJS, logLevel, CompressionTypes, CompressionCodecs } = require('kafkajs');
const { Kafka } = require('cloudevents');
const inbox = require('./inbox');

// The relay's producer (franz-go) compresses record batches with snappy,
// which kafkajs reads only with a codec registered.
CompressionCodecs[CompressionTypes.Snappy] = require('kafkajs-snappy');

const [topic, consumer, expected] = [process.argv[2], process.argv[3], Number(process.argv[4])];

async function main() {
  const box = await inbox.open(consumer);
  const kafka = new KafkaJS({ clientId: consumer, brokers: (process.env.KAFKA_BROKERS || '127.0.0.1:9092').split(','), logLevel: logLevel.ERROR });
  const group = kafka.consumer({ groupId: consumer });
  await group.connect();
  await group.subscribe({ topic, fromBeginning: true });
  let done;
  const finished = new Promise((resolve) => { done = resolve; });
  await group.run({
    autoCommit: true, // kafkajs commits an offset only after eachMessage returned
    eachMessage: async ({ message: m }) => {
      // kafkajs gives Buffers; the binding reads strings.
      const headers = Object.fromEntries(Object.entries(m.headers).map(([k, v]) => [k, v.toString('utf8')]));
      const ce = Kafka.toEvent({ key: m.key && m.key.toString('utf8'), value: m.value, headers });
      const ev = { ...ce, sequence: ce.sequence, data: Buffer.isBuffer(ce.data) ? ce.data.toString('utf8') : JSON.stringify(ce.data), traceparent: headers.traceparent,
        time: headers.ce_time }; // the header itself: toEvent keeps milliseconds of it only
      try { ce.validate(); } catch (err) { box.seen.bad.push(`${ce.id}: cloudevents validate: ${err.message}`); }
      const answer = await box.claim(ev);
      // An early event cannot be put back in a partition: fail, and kafkajs
      // reads it again from the last committed offset.
      if (answer === 'early') throw new Error(`event ${ce.id} is early`);
      if (box.seen.apply >= expected) done();
    },
  });
  await finished;
  console.log(JSON.stringify(box.seen));
  await group.disconnect();
  await box.end();
}

main().catch((err) => { console.error(err); process.exit(1); });
