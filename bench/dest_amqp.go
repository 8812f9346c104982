package main

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox/outboxamqp"
)

// openAMQP declares an exchange and a durable classic queue of the space's
// own on the machine's RabbitMQ (the queue bound with "#", so that every
// event is stored), and returns an outboxamqp publisher on the exchange.
func openAMQP(ctx context.Context, e *env, s space) (*target, error) {
	exchange, queue := s.prefix+".x", s.prefix+".q"
	pub, err := outboxamqp.NewPublisher(outboxamqp.Config{URL: e.o.amqpURL, Exchange: exchange})
	if err != nil {
		return nil, err
	}
	conn, ch, err := amqpChannel(e.o.amqpURL)
	if err != nil {
		pub.Close()
		return nil, err
	}
	cleanup := func() {
		pub.Close()
		if !e.o.keep {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_ = ch.ExchangeDelete(exchange, false, false)
		}
		_ = conn.Close()
	}
	if err := pub.Probe(ctx); err != nil { // declares the exchange
		cleanup()
		return nil, err
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		cleanup()
		return nil, err
	}
	if err := ch.QueueBind(queue, "#", exchange, false, nil); err != nil {
		cleanup()
		return nil, err
	}
	return &target{pub: pub, close: cleanup,
		check: func(ctx context.Context, n int) (int, error) { return checkAMQPOrder(ctx, e.o.amqpURL, queue, n) }}, nil
}

func amqpChannel(url string) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, nil, fmt.Errorf("RabbitMQ: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

// checkAMQPOrder consumes n distinct events from queue and checks I5 (see
// orderCheck) in the queue's order.
func checkAMQPOrder(ctx context.Context, url, queue string, n int) (int, error) {
	conn, ch, err := amqpChannel(url)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if err := ch.Qos(1000, 0, false); err != nil {
		return 0, err
	}
	ds, err := ch.ConsumeWithContext(ctx, queue, "", false, true, false, false, nil)
	if err != nil {
		return 0, err
	}
	oc := newOrderCheck()
	limit := time.NewTimer(2 * time.Minute)
	defer limit.Stop()
	for got, _ := oc.result(); got < n; got, _ = oc.result() {
		select {
		case d, ok := <-ds:
			if !ok {
				return got, fmt.Errorf("queue %s: consumer closed after %d of %d events", queue, got, n)
			}
			m, err := outboxamqp.Decode(d)
			if err != nil {
				return got, err
			}
			if err := oc.add(m, "queue "+queue); err != nil {
				return got, err
			}
			if err := d.Ack(true); err != nil {
				return got, err
			}
		case <-limit.C:
			return got, fmt.Errorf("queue %s: read %d of %d events in 2 minutes", queue, got, n)
		case <-ctx.Done():
			return got, ctx.Err()
		}
	}
	return oc.result()
}
