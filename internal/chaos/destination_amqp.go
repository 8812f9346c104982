package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/inventory"
	"github.com/pgoutbox/outbox/internal/rabbitnode"
	"github.com/pgoutbox/outbox/outboxamqp"
)

func init() {
	registerDestination(destinationKind{name: "amqp", schemes: []string{"amqp", "amqps"}, open: openAMQP})
}

// witnessSuffix names the witness queue: "<exchange>.witness".
const witnessSuffix = ".witness"

// amqpDestination is an exchange of the run's own (unless the URL names
// one) on a RabbitMQ node of the run's own (restartable), on the broker
// DestinationConfig.AMQPURL names (the demo: the machine's), or on the
// external broker of a URL, with two durable queues bound for the order
// events before any relay starts, so that no event is unroutable (the
// relay would quarantine it):
//
//   - the consumers' queue, inventory.AMQPQueue(exchange, durable), which
//     the inventory consumers share (competing consumers; the inbox keeps
//     each order in order, see inventory.DeclareAMQPQueue);
//   - the witness queue, "<exchange>.witness", bound with the same key,
//     which only the harness reads: a consuming queue loses its messages
//     once they are acked, so Messages reads every order event from the
//     witness instead, in the order the exchange routed them, without
//     acking (they go back into the queue, in place, for the next read).
type amqpDestination struct {
	node     *rabbitnode.Node // nil on a broker that is there already
	shared   bool             // the broker of DestinationConfig.AMQPURL
	broker   string           // URL without query
	url      string           // the relays' and consumers' --destination
	exchange string
	key      string // binding key of the order events
	queue    string // the consumers'
	witness  string

	mu   sync.Mutex
	conn *amqp.Connection
}

func openAMQP(ctx context.Context, cfg DestinationConfig, rawURL string) (Destination, error) {
	d := &amqpDestination{}
	switch {
	case rawURL != "":
	case cfg.AMQPURL != "":
		d.shared, rawURL = true, cfg.AMQPURL
	default:
		dir := filepath.Join(cfg.Dir, "rabbitmq")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		logf := func(format string, args ...any) {
			if cfg.Sink != nil {
				cfg.Sink("rabbitmq", fmt.Sprintf(format, args...))
			}
		}
		var err error
		if d.node, err = rabbitnode.New(rabbitnode.Config{Dir: dir, Logf: logf}); err != nil {
			return nil, err
		}
		if err := d.node.Start(ctx); err != nil {
			return nil, err
		}
		rawURL = d.node.URL()
	}
	pcfg, err := outboxamqp.ParseURL(rawURL)
	if err != nil {
		d.stopNode()
		return nil, err
	}
	d.broker, d.url, d.exchange = pcfg.URL, rawURL, pcfg.Exchange
	if d.exchange == "" {
		// The run's own exchange.
		d.exchange = cfg.Tag
		sep := "?"
		if strings.Contains(rawURL, "?") {
			sep = "&"
		}
		d.url += sep + "exchange=" + url.QueryEscape(d.exchange)
	}
	if d.key, err = inventory.AMQPBindingKey(pcfg.RoutingKey); err != nil {
		d.stopNode()
		return nil, err
	}
	d.queue = inventory.AMQPQueue(d.exchange, inventory.DurableDefault)
	d.witness = d.exchange + witnessSuffix
	err = d.withChannel(ctx, func(ch *amqp.Channel) error {
		if err := inventory.DeclareAMQPQueue(ch, d.exchange, d.queue, d.key); err != nil {
			return err
		}
		return inventory.DeclareAMQPQueue(ch, d.exchange, d.witness, d.key)
	})
	if err != nil {
		_ = d.Close(true)
		return nil, err
	}
	return d, nil
}

func (d *amqpDestination) stopNode() {
	if d.node != nil {
		_ = d.node.Stop()
	}
}

func (d *amqpDestination) Name() string { return "amqp" }

func (d *amqpDestination) Describe() string {
	where := "RabbitMQ at " + redactAMQP(d.broker)
	if d.node != nil {
		where = "RabbitMQ node of the run's own at " + redactAMQP(d.broker)
	}
	return fmt.Sprintf("%s, exchange %s, queue %s (witness %s)", where, d.exchange, d.queue, d.witness)
}

// redactAMQP is the URL without its password.
func redactAMQP(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

func (d *amqpDestination) URL() string { return d.url }

func (d *amqpDestination) Args(string) []string { return nil }

func (d *amqpDestination) Restartable() bool { return d.node != nil }

func (d *amqpDestination) Stop() error {
	if d.node == nil {
		return errNotRestartable(d)
	}
	return d.node.Stop()
}

func (d *amqpDestination) Start(ctx context.Context) error {
	if d.node == nil {
		return nil
	}
	return d.node.Start(ctx)
}

func (d *amqpDestination) Restarts() int {
	if d.node == nil {
		return 0
	}
	return d.node.Restarts()
}

// withChannel runs f on a new channel of the harness's connection,
// connecting again when the connection was lost (a broker restart), and
// closes the channel after.
func (d *amqpDestination) withChannel(ctx context.Context, f func(*amqp.Channel) error) error {
	d.mu.Lock()
	if d.conn == nil || d.conn.IsClosed() {
		props := amqp.NewConnectionProperties()
		props.SetClientConnectionName("outbox-chaos")
		conn, err := amqp.DialConfig(d.broker, amqp.Config{Properties: props, Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			d.mu.Unlock()
			return fmt.Errorf("connect to RabbitMQ at %s: %s", redactAMQP(d.broker), strings.ReplaceAll(err.Error(), d.broker, redactAMQP(d.broker)))
		}
		d.conn = conn
	}
	conn := d.conn
	d.mu.Unlock()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("RabbitMQ channel: %w", err)
	}
	defer ch.Close()
	done := make(chan error, 1)
	go func() { done <- f(ch) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = ch.Close() // ends f's calls
		<-done
		return ctx.Err()
	}
}

// Messages reads the witness queue: every order event the exchange routed,
// in routing order. It consumes without acking and then closes the
// channel, so RabbitMQ puts every message back in its place, for the next
// read.
func (d *amqpDestination) Messages(ctx context.Context) ([]outbox.Message, error) {
	var out []outbox.Message
	err := d.withChannel(ctx, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(d.witness, true, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("witness queue %s: %w", d.witness, err)
		}
		want := q.Messages // no one else consumes it: all are ready
		if want == 0 {
			return nil
		}
		if err := ch.Qos(0, 0, false); err != nil {
			return err
		}
		deliveries, err := ch.Consume(d.witness, "outbox-chaos-witness", false, true, false, false, nil)
		if err != nil {
			return fmt.Errorf("read witness queue %s: %w", d.witness, err)
		}
		timeout := time.NewTimer(time.Minute)
		defer timeout.Stop()
		for len(out) < want {
			select {
			case m, ok := <-deliveries:
				if !ok {
					return fmt.Errorf("read witness queue %s: channel closed after %d of %d messages", d.witness, len(out), want)
				}
				msg, err := outboxamqp.Decode(m)
				if err != nil {
					return fmt.Errorf("message %q on %s does not decode: %w", m.MessageId, d.witness, err)
				}
				out = append(out, msg)
			case <-timeout.C:
				return fmt.Errorf("read witness queue %s: got %d of %d messages", d.witness, len(out), want)
			}
		}
		return nil // closing the channel requeues them, in place
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Progress is the consumers' queue's depth: Pending is the count of
// messages ready for delivery. AMQP does not tell the count delivered and
// not yet acknowledged (only the management plugin's HTTP API does), so
// InFlight is 0, and Deliveries -1: once every event is applied (the
// convergence condition), what a consumer still holds is a duplicate,
// which its inbox drops.
func (d *amqpDestination) Progress(ctx context.Context, consumer string) (ConsumerProgress, error) {
	var p ConsumerProgress
	err := d.withChannel(ctx, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(inventory.AMQPQueue(d.exchange, consumer), true, false, false, false, nil)
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return nil
		}
		if err != nil {
			return err
		}
		p = ConsumerProgress{Exists: true, Pending: int64(q.Messages), Deliveries: -1}
		return nil
	})
	return p, err
}

// Close deletes the queues and the exchange from a broker that was there
// already unless keep, and stops a node of the run's own.
func (d *amqpDestination) Close(keep bool) error {
	var err error
	if d.node == nil && !keep {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = d.withChannel(ctx, func(ch *amqp.Channel) error {
			for _, q := range []string{d.queue, d.witness} {
				if _, err := ch.QueueDelete(q, false, false, false); err != nil {
					return fmt.Errorf("delete queue %s: %w", q, err)
				}
			}
			if err := ch.ExchangeDelete(d.exchange, false, false); err != nil {
				return fmt.Errorf("delete exchange %s: %w", d.exchange, err)
			}
			return nil
		})
		cancel()
	}
	d.mu.Lock()
	if d.conn != nil {
		_ = d.conn.Close()
	}
	d.mu.Unlock()
	if d.node != nil {
		err = errors.Join(err, d.node.Stop())
	}
	return err
}
