package destinationtest_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/destinationtest"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// TestAMQP runs the suite on RabbitMQ: the machine's broker, and a node of
// the test's own for the restart.
func TestAMQP(t *testing.T) {
	t.Parallel()
	destinationtest.Run(t, destinationtest.Destination{
		AttributePrefix: "cloudEvents:",
		DedupKey:        true, // message-id: RabbitMQ does not drop duplicates, consumers may
		Open:            func(t *testing.T) destinationtest.Target { return amqpTarget(t, rabbittest.URL()) },
		OpenRestartable: func(t *testing.T) destinationtest.Target {
			node := rabbittest.Start(t)
			tg := amqpTarget(t, node.URL())
			tg.Restart = func(t *testing.T) {
				node.Stop()
				node.Start()
			}
			return tg
		},
	})
}

// amqpMaxMessage is the publishers' MaxMessageBytes.
const amqpMaxMessage = 1 << 20

// amqpTarget declares an exchange of the test's own and a classic durable
// queue bound to every aggregate type's routing key (a classic queue keeps
// persistent messages across a restart, like a quorum queue, on one node).
func amqpTarget(t *testing.T, url string) destinationtest.Target {
	exchange, queue := rabbittest.UniqueName("conformance-x"), rabbittest.UniqueName("conformance-q")
	p := amqpPublisher(t, outboxamqp.Config{URL: url, Exchange: exchange, MaxMessageBytes: amqpMaxMessage})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Probe(ctx); err != nil { // declares the exchange
		t.Fatal(err)
	}
	ch, err := rabbittest.Conn(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, typ := range destinationtest.AggregateTypes {
		key, err := outboxamqp.RoutingKey(outboxamqp.RoutingKeyDefault, typ, "x")
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(queue, key, exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if c, err := amqp.Dial(url); err == nil {
			if ch, err := c.Channel(); err == nil {
				_, _ = ch.QueueDelete(queue, false, false, false)
				_ = ch.ExchangeDelete(exchange, false, false)
			}
			_ = c.Close()
		}
	})
	return destinationtest.Target{
		Publisher: p,
		Read: func(ctx context.Context, n int) ([]destinationtest.Delivery, error) {
			return readQueue(ctx, url, queue, n)
		},
		Unreachable: func(t *testing.T) outbox.Publisher {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			free := l.Addr().String()
			l.Close()
			return amqpPublisher(t, outboxamqp.Config{URL: "amqp://guest:guest@" + free + "/", Exchange: exchange, DialTimeout: time.Second})
		},
		Refuse: func(m outbox.Message) outbox.Message {
			m.Payload = make([]byte, amqpMaxMessage+1)
			m.ContentType = "application/octet-stream"
			return m
		},
		Unroute: func(m outbox.Message) outbox.Message {
			m.AggregateType = "unrouted" // no queue is bound to its routing key: returned (mandatory)
			return m
		},
	}
}

func amqpPublisher(t *testing.T, cfg outboxamqp.Config) *outboxamqp.Publisher {
	p, err := outboxamqp.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// readQueue takes every message off the queue, in queue order, once it
// holds at least n, with a connection of its own.
func readQueue(ctx context.Context, url, queue string, n int) ([]destinationtest.Delivery, error) {
	c, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return nil, err
	}
	var out []destinationtest.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			return out, err
		}
		if !ok {
			if len(out) >= n {
				return out, nil
			}
			select {
			case <-ctx.Done():
				return out, ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		m, err := outboxamqp.Decode(d)
		if err != nil {
			return out, err
		}
		a := map[string]string{}
		for k, v := range d.Headers {
			a[k] = fmt.Sprint(v)
		}
		out = append(out, destinationtest.Delivery{Message: m, Attributes: a, Key: d.MessageId})
	}
}
