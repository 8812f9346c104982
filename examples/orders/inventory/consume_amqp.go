package inventory

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox/examples/orders/internal/natsloop"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// AMQPQueue is the name of the queue the consumers named durable read the
// order events of exchange from: "<exchange>.<durable>", so that the same
// consumer name on two exchanges (two systems on one broker) never shares a
// queue.
func AMQPQueue(exchange, durable string) string { return exchange + "." + durable }

// AMQPBindingKey is the key that binds a queue to the order events
// published with the routing key template (outboxamqp.Config.RoutingKey;
// "" for its default): the template for the order aggregate type, with
// "{aggregate_id}" matching any one word ("*"; order ids are UUIDs, without
// dots).
func AMQPBindingKey(template string) (string, error) {
	if template == "" {
		template = outboxamqp.RoutingKeyDefault
	}
	return outboxamqp.RoutingKey(template, orderevents.AggregateType, "*")
}

// DeclareAMQPQueue declares, on ch, the exchange as the publisher declares
// it (a durable topic exchange), and a durable queue bound to it with
// bindingKey. Declaring is idempotent: the consumer does it on each
// connection, and whoever must make sure no event is published before the
// queue exists (the chaos harness, an operator) does it first.
//
// The queue is a classic durable queue without
// x-single-active-consumer: consumer processes compete for its messages,
// and the inbox keeps each order's events in order (an event that arrives
// before its predecessor was applied is handed back and delivered again).
// A single active consumer would keep the queue's order across processes,
// but would leave all but one idle, and would make the chaos harness's I5
// check test the broker's order rather than the consumer's.
func DeclareAMQPQueue(ch *amqp.Channel, exchange, queue, bindingKey string) error {
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %q: %w", exchange, err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %q: %w", queue, err)
	}
	if err := ch.QueueBind(queue, bindingKey, exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %q to %q with %q: %w", queue, exchange, bindingKey, err)
	}
	return nil
}

// RunAMQP consumes the order events that the relay publishes to exchange
// with the routing key template (outboxamqp.Config.RoutingKey, "" for its
// default) on the RabbitMQ broker at amqpURL, from the queue
// AMQPQueue(exchange, Config.Durable), until ctx ends; then it stops
// consuming, finishes the messages it holds and returns nil.
//
// On each connection it declares the exchange, the queue and its binding
// (DeclareAMQPQueue), sets a prefetch of 4 messages per worker and hands
// each delivery to one of Workers goroutines, which apply it through the
// inbox and acknowledge it only after the inbox transaction committed
// (manual acks: a consumer that dies before its ack has the message
// delivered again, to it or another, and the inbox drops what it applied
// already). An event that cannot be applied yet (an earlier event of its
// order is not applied, or applying failed) is held for the delay and
// handed back with a requeueing nack; an undecodable message is counted,
// logged and rejected without requeueing. The connection's heartbeat is
// half of AckWait (1 to 10 seconds), so the broker takes back the messages
// of a consumer that stopped responding soon. While the broker is
// unreachable (a restart), it reconnects with a growing delay.
func (c *Consumer) RunAMQP(ctx context.Context, amqpURL, exchange, routingKey string) error {
	if amqpURL == "" || exchange == "" {
		return errors.New("inventory: RunAMQP needs a broker URL and an exchange")
	}
	key, err := AMQPBindingKey(routingKey)
	if err != nil {
		return fmt.Errorf("inventory: %w", err)
	}
	queue := AMQPQueue(exchange, c.cfg.Durable)
	c.log.Info("inventory consumer starting", slog.String("broker", redactURL(amqpURL)), slog.String("exchange", exchange),
		slog.String("queue", queue), slog.String("binding_key", key), slog.Int("workers", c.cfg.Workers))
	failures := 0
	for ctx.Err() == nil {
		began := time.Now()
		err := c.amqpSession(ctx, amqpURL, exchange, queue, key)
		if ctx.Err() != nil {
			break
		}
		if time.Since(began) > 10*time.Second {
			failures = 0 // it ran a while: start the delays again
		}
		failures++
		d := natsloop.Backoff(failures, 250*time.Millisecond, 5*time.Second)
		c.log.Warn("amqp session ended; reconnecting", slog.Any("error", err), slog.Duration("retry_in", d))
		natsloop.Sleep(ctx, d)
	}
	c.log.Info("inventory consumer stopped", slog.Any("stats", c.Stats()))
	return nil
}

// amqpSession is one connection: declare, consume, process, until ctx ends
// (nil) or the connection or channel is lost.
func (c *Consumer) amqpSession(ctx context.Context, amqpURL, exchange, queue, key string) error {
	heartbeat := min(max(c.cfg.AckWait/2, time.Second), 10*time.Second)
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("orders-inventory")
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{Heartbeat: heartbeat, Properties: props,
		Dial: amqp.DefaultDial(5 * time.Second), TLSClientConfig: c.cfg.AMQPTLS.Clone()})
	if err != nil {
		return fmt.Errorf("connect to %s: %s", redactURL(amqpURL), redactErr(err, amqpURL))
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := DeclareAMQPQueue(ch, exchange, queue, key); err != nil {
		return err
	}
	if err := ch.Qos(4*c.cfg.Workers, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	tag := consumerTag()
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %q: %w", queue, err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	// On shutdown, stop the deliveries (the channel of deliveries closes)
	// and finish what was handed out: those messages are acked rather than
	// left to the broker to requeue.
	stop := context.AfterFunc(ctx, func() { _ = ch.Cancel(tag, false) })
	defer stop()

	work := make(chan amqp.Delivery)
	var wg sync.WaitGroup
	var attempts sync.Map // message id -> deliveries seen here
	for range c.cfg.Workers {
		wg.Go(func() {
			for d := range work {
				c.processAMQP(ctx, d, &attempts)
			}
		})
	}
	for d := range deliveries {
		work <- d
	}
	close(work)
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	select {
	case e := <-closed:
		if e != nil {
			return e
		}
	default:
	}
	return errors.New("deliveries ended (consumer cancelled by the broker, or connection lost)")
}

// processAMQP handles one delivery: decode, then deliver (the inbox), then
// ack, or hold it for the delay and nack it back into the queue.
func (c *Consumer) processAMQP(ctx context.Context, d amqp.Delivery, attempts *sync.Map) {
	c.delivered.Add(1)
	msg, err := outboxamqp.Decode(d)
	if err != nil {
		c.rejected.Add(1)
		c.log.Error("undecodable message rejected", slog.String("routing_key", d.RoutingKey),
			slog.String("message_id", d.MessageId), slog.Any("error", err))
		_ = d.Reject(false)
		return
	}
	// RabbitMQ tells only whether a message was delivered before; count
	// the deliveries this process saw, so the delays grow.
	delivery := 1
	if d.Redelivered {
		delivery = 2
	}
	if n, ok := attempts.Load(d.MessageId); ok {
		delivery = max(delivery, n.(int)+1)
	}
	v, wait := c.deliver(ctx, msg, delivery)
	if v == settle {
		attempts.Delete(d.MessageId)
		if err := d.Ack(false); err != nil {
			c.log.Warn("ack failed; the redelivery will be a duplicate", slog.String("event_id", msg.ID.String()), slog.Any("error", err))
		}
		return
	}
	// again, or dropAck: the failpoint skips the ack as a crash there
	// would, and the broker delivers the message again.
	attempts.Store(d.MessageId, delivery)
	natsloop.Sleep(ctx, wait)
	_ = d.Nack(false, true)
}

func consumerTag() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("orders-inventory-%d-%s", os.Getpid(), hex.EncodeToString(b))
}

// redactURL is the URL without its password.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// redactErr is err's text with the URL's password, if any, replaced.
func redactErr(err error, raw string) string {
	s := err.Error()
	if u, perr := url.Parse(raw); perr == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			s = strings.ReplaceAll(s, pw, "xxxxx")
		}
	}
	return s
}
