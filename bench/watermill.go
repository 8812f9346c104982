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

// benchWatermill fills Watermill's SQL forwarder table with n enveloped
// messages (through Watermill's own forwarder publisher, 1,000 per
// transaction) and lets its forwarder (SQL subscriber on PostgreSQL,
// watermill-nats publisher with JetStream and Nats-Msg-Id tracking) forward
// them to a stream. batch 0 keeps Watermill's defaults (SubscribeBatchSize
// 100). The rate is measured over the whole backlog or, when that would take
// longer, over the first watermillCap of forwarding.
//
// relaySession runs the forwarder's pool with our relay's session settings
// (outbox.RelaySessionParams) instead of the plain pool a Watermill user
// would pass.
func benchWatermill(ctx context.Context, e *env, n, aggs, batch int, relaySession bool) (float64, string, error) {
	name := "relay-wm-default"
	if batch > 0 {
		name = fmt.Sprintf("relay-wm-%d", batch)
	}
	if relaySession {
		name += "-rs"
	}
	s, cleanup, err := e.newSpace(ctx, name)
	if err != nil {
		return 0, "", err
	}
	defer cleanup()
	pool, err := e.pool(ctx, 4)
	if relaySession {
		pool, err = e.relayPool(ctx, 4)
	}
	if err != nil {
		return 0, "", err
	}
	defer pool.Close()
	logger := watermill.NopLogger{}
	schema := wmsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(topic string) string { return fmt.Sprintf(`%s."watermill_%s"`, s.schema, topic) },
		SubscribeBatchSize:        batch,
	}
	offsets := wmsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string {
			return fmt.Sprintf(`%s."watermill_offsets_%s"`, s.schema, topic)
		},
	}
	db := wmsql.BeginnerFromPgx(pool)
	sqlPub, err := wmsql.NewPublisher(db, wmsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		return 0, "", err
	}
	fwdPub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{})
	// One message through Watermill's own publisher creates the table and
	// shows the envelope format; the backlog is then generated in SQL in
	// exactly that format (one transaction per 1,000 messages), because
	// publishing 200,000 messages one INSERT at a time takes minutes. The
	// messages carry the same attributes as ours, as metadata (headers).
	first := message.NewMessage(watermill.NewUUID(), []byte(payload))
	if err := fwdPub.Publish(outboxnats.Subject(s.prefix, "order", "o-first"), first); err != nil {
		return 0, "", err
	}
	table := fmt.Sprintf(`%s."watermill_forwarder_topic"`, s.schema)
	for i := 0; i < n; i += 1000 {
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s (uuid, payload, metadata, transaction_id)
SELECT gen_random_uuid()::text, json_build_object(
	'destination_topic', %[2]s || '.order.o-' || (j %% %[3]d),
	'uuid', gen_random_uuid()::text,
	'payload', translate(encode(convert_to(%[4]s, 'UTF8'), 'base64'), E'\n', ''),
	'metadata', json_build_object('ce-type', 'OrderUpdated', 'ce-subject', 'o-' || (j %% %[3]d),
		'ce-aggregatetype', 'order', 'ce-sequence', lpad((j / %[3]d + 1)::text, 20, '0'),
		'ce-time', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), 'content-type', 'application/json')),
	'{}'::json, pg_current_xact_id()
FROM generate_series(%[5]d, %[6]d) AS j`, table, quote(s.prefix), aggs, quote(payload), i, min(i+1000, n)-1))
		if err != nil {
			return 0, "", fmt.Errorf("load watermill backlog: %w", err)
		}
	}
	total := n + 1 // the table-creating message
	if _, err := e.admin.Exec(ctx, "VACUUM (ANALYZE) "+table); err != nil {
		return 0, "", err
	}
	e.logf("relay/watermill batch %d: %d messages loaded", batch, total)

	// The stream, created like ours.
	if _, nc, err := e.publisher(ctx, s); err != nil {
		return 0, "", err
	} else {
		nc.Close()
	}
	nc, err := nats.Connect(e.o.natsURL, nats.Name("outbox-bench-watermill"))
	if err != nil {
		return 0, "", err
	}
	defer nc.Close()
	natsPub, err := wmnats.NewPublisherWithNatsConn(nc, wmnats.PublisherPublishConfig{
		Marshaler:         &wmnats.NATSMarshaler{},
		SubjectCalculator: wmnats.DefaultSubjectCalculator,
		JetStream:         wmnats.JetStreamConfig{TrackMsgId: true},
	}, logger)
	if err != nil {
		return 0, "", err
	}
	sub, err := wmsql.NewSubscriber(db, wmsql.SubscriberConfig{
		SchemaAdapter: schema, OffsetsAdapter: offsets, InitializeSchema: true,
	}, logger)
	if err != nil {
		return 0, "", err
	}
	fwd, err := forwarder.NewForwarder(sub, natsPub, logger, forwarder.Config{})
	if err != nil {
		return 0, "", err
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
	rate := float64(got) / elapsed.Seconds()
	note := fmt.Sprintf("forwarded all %d in %s", got, elapsed.Round(time.Millisecond))
	if got < uint64(total) {
		note = fmt.Sprintf("rate over the first %s: %d of %d forwarded", elapsed.Round(time.Second), got, total)
	}
	e.logf("relay/watermill batch %d: %.0f events/s (%s)", batch, rate, note)
	return rate, note, nil
}
