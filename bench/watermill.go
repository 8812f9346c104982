package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/pgoutbox/outbox/outboxnats"
)

// wmVariant is one configuration of Watermill's outbox: its forwarder
// (components/forwarder, the component Watermill's docs name for a
// transactional outbox) reading watermill-sql's PostgreSQL pub/sub and
// publishing with watermill-nats to JetStream.
type wmVariant struct {
	scenario string // relay/watermill-<scenario>
	// queue selects watermill-sql's queue schema (PostgreSQLQueueSchema,
	// PostgreSQLQueueOffsetsAdapter with DeleteOnAck) instead of its default
	// pub/sub schema (DefaultPostgreSQLSchema, DefaultPostgreSQLOffsetsAdapter).
	queue bool
	// batch is SubscribeBatchSize (0: Watermill's default, 100).
	batch int
	// relaySession runs the forwarder's pool with our relay's session
	// settings (outbox.RelaySessionParams) instead of the plain pool a
	// Watermill user would pass.
	relaySession bool
	doc          string
}

// wmVariants are the Watermill configurations the relay group measures, in
// the order it runs them. Everything not named here is at Watermill's
// defaults: AckDeadline 30 s, PollInterval 1 s (it only matters once the
// table is empty), ResendInterval 1 s, ConsumerGroup "", the forwarder's
// topic "forwarder_topic", no middleware; the NATS publisher with
// TrackMsgId on and AckAsync off (what watermill-nats' docs require for
// exactly-once) and without AutoProvision (the stream exists, created as
// for our relay).
var wmVariants = []wmVariant{
	{scenario: "defaults", doc: "default schema and offsets adapter, SubscribeBatchSize 100 (the default)"},
	{scenario: "batch1000", batch: 1000, doc: "default schema and offsets adapter, SubscribeBatchSize 1000 (our relay's batch)"},
	{scenario: "queue-batch1000", queue: true, batch: 1000,
		doc: "queue schema, acked rows deleted (DeleteOnAck), SubscribeBatchSize 1000"},
	{scenario: "batch1000-our-session", batch: 1000, relaySession: true,
		doc: "as batch1000, on a pool with our relay's session settings (jit off, synchronous_commit off)"},
}

// wmResult is one Watermill drain: how many messages reached the stream in
// how long.
type wmResult struct {
	rate    float64
	events  int64
	seconds float64
	note    string
}

// benchWatermill fills Watermill's SQL forwarder table with n enveloped
// messages (one through Watermill's own forwarder publisher, the others
// generated in SQL in exactly its format, 1,000 per transaction) and lets
// its forwarder forward them to the space's stream, on the same subjects as
// our relay (one per aggregate: see BENCHMARKS.md). The rate is measured
// over the whole backlog or, when that would take longer, over the first
// watermillCap of forwarding: messages the stream acknowledged, from the
// forwarder's start.
func benchWatermill(ctx context.Context, e *env, n, aggs int, v wmVariant) (wmResult, error) {
	name := "relay-wm-" + v.scenario
	batch := v.batch
	s, cleanup, err := e.newSpace(ctx, name)
	if err != nil {
		return wmResult{}, err
	}
	defer cleanup()
	pool, err := e.pool(ctx, 4)
	if v.relaySession {
		pool, err = e.relayPool(ctx, 4)
	}
	if err != nil {
		return wmResult{}, err
	}
	defer pool.Close()
	logger := watermill.NopLogger{}
	table := func(topic string) string { return fmt.Sprintf(`%s."watermill_%s"`, s.schema, topic) }
	var schema wmsql.SchemaAdapter = wmsql.DefaultPostgreSQLSchema{GenerateMessagesTableName: table, SubscribeBatchSize: batch}
	var offsets wmsql.OffsetsAdapter = wmsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string {
			return fmt.Sprintf(`%s."watermill_offsets_%s"`, s.schema, topic)
		},
	}
	if v.queue {
		schema = wmsql.PostgreSQLQueueSchema{GenerateMessagesTableName: table, SubscribeBatchSize: batch}
		offsets = wmsql.PostgreSQLQueueOffsetsAdapter{GenerateMessagesTableName: table, DeleteOnAck: true}
	}
	db := wmsql.BeginnerFromPgx(pool)
	sqlPub, err := wmsql.NewPublisher(db, wmsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		return wmResult{}, err
	}
	fwdPub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{})
	// One message through Watermill's own publisher creates the table and
	// shows the envelope format; the backlog is then generated in SQL in
	// exactly that format (one transaction per 1,000 messages), because
	// publishing 200,000 messages one INSERT at a time takes minutes. The
	// messages carry the same attributes as ours, as metadata (headers).
	first := message.NewMessage(watermill.NewUUID(), []byte(payload))
	if err := fwdPub.Publish(outboxnats.Subject(s.prefix, "order", "o-first"), first); err != nil {
		return wmResult{}, err
	}
	fwdTable := table("forwarder_topic")
	// The default schema records each row's transaction (its cursor); the
	// queue schema has none (its cursor is the acked flag, or the row's
	// absence).
	cols, xact := "uuid, payload, metadata, transaction_id", ", pg_current_xact_id()"
	if v.queue {
		cols, xact = "uuid, payload, metadata", ""
	}
	for i := 0; i < n; i += 1000 {
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s (%[7]s)
SELECT gen_random_uuid()::text, json_build_object(
	'destination_topic', %[2]s || '.order.o-' || (j %% %[3]d),
	'uuid', gen_random_uuid()::text,
	'payload', translate(encode(convert_to(%[4]s, 'UTF8'), 'base64'), E'\n', ''),
	'metadata', json_build_object('ce-type', 'OrderUpdated', 'ce-subject', 'o-' || (j %% %[3]d),
		'ce-aggregatetype', 'order', 'ce-sequence', lpad((j / %[3]d + 1)::text, 20, '0'),
		'ce-time', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), 'content-type', 'application/json')),
	'{}'::json%[8]s
FROM generate_series(%[5]d, %[6]d) AS j`, fwdTable, quote(s.prefix), aggs, quote(payload), i, min(i+1000, n)-1, cols, xact))
		if err != nil {
			return wmResult{}, fmt.Errorf("load watermill backlog: %w", err)
		}
	}
	total := n + 1 // the table-creating message
	if _, err := e.admin.Exec(ctx, "VACUUM (ANALYZE) "+fwdTable); err != nil {
		return wmResult{}, err
	}
	e.logf("relay/watermill-%s: %d messages loaded", v.scenario, total)

	// The stream, created like ours.
	if _, nc, err := e.publisher(ctx, s); err != nil {
		return wmResult{}, err
	} else {
		nc.Close()
	}
	nc, err := nats.Connect(e.o.natsURL, nats.Name("outbox-bench-watermill"))
	if err != nil {
		return wmResult{}, err
	}
	defer nc.Close()
	natsPub, err := wmnats.NewPublisherWithNatsConn(nc, wmnats.PublisherPublishConfig{
		Marshaler:         &wmnats.NATSMarshaler{},
		SubjectCalculator: wmnats.DefaultSubjectCalculator,
		JetStream:         wmnats.JetStreamConfig{TrackMsgId: true},
	}, logger)
	if err != nil {
		return wmResult{}, err
	}
	sub, err := wmsql.NewSubscriber(db, wmsql.SubscriberConfig{
		SchemaAdapter: schema, OffsetsAdapter: offsets, InitializeSchema: true,
	}, logger)
	if err != nil {
		return wmResult{}, err
	}
	fwd, err := forwarder.NewForwarder(sub, natsPub, logger, forwarder.Config{})
	if err != nil {
		return wmResult{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- fwd.Run(runCtx) }()
	deadline := start.Add(e.sz.watermillCap)
	var got uint64
	for {
		got = e.streamMsgs(ctx, s.stream)
		if got >= uint64(total) || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	_ = fwd.Close()
	stop()
	<-done
	r := wmResult{rate: float64(got) / elapsed.Seconds(), events: int64(got), seconds: elapsed.Seconds()}
	r.note = fmt.Sprintf("%s; forwarded all %d in %s", v.doc, got, elapsed.Round(time.Millisecond))
	if got < uint64(total) {
		r.note = fmt.Sprintf("%s; rate over the first %s: %d of %d forwarded", v.doc, elapsed.Round(time.Second), got, total)
	}
	e.logf("relay/watermill-%s: %.0f events/s (%s)", v.scenario, r.rate, r.note)
	return r, nil
}
