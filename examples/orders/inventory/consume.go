package inventory

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/internal/destination"
	"github.com/pgoutbox/outbox/outboxamqp"
	"github.com/pgoutbox/outbox/outboxkafka"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// Schemes lists the destination URL schemes Run consumes from.
const Schemes = "nats://host:port, kafka://host:port[,host:port][?topic=outbox.{aggregate_type}], amqp[s]://user@host:port/vhost[?exchange=outbox&routing_key=outbox.{aggregate_type}], http://host:port/path (the webhook URL the relay posts to; served here)"

// Run consumes the order events from the destination URL (the one the
// relay publishes to) until ctx ends, with the transport of its scheme:
// nats:// (and tls://) reads the JetStream stream Config.Stream through the
// durable consumer Config.Durable (RunNATS); kafka:// reads the topic the
// URL's topic template gives the order aggregate type (default
// "outbox.order") as the consumer group Config.Durable (RunKafka); amqp://
// (and amqps://) reads the RabbitMQ queue "<exchange>.<durable>" bound to
// the URL's exchange for the order events (RunAMQP); http:// is the
// webhook the relay posts to: the consumer serves it on the URL's host,
// port and path, verifying the requests with the secrets in
// OUTBOX_WEBHOOK_SECRET (RunWebhook).
func (c *Consumer) Run(ctx context.Context, destinationURL string) error {
	scheme, _, _ := strings.Cut(destinationURL, "://")
	switch scheme {
	case "nats", "tls":
		nc, err := destination.ConnectNATS(destinationURL, "orders-inventory")
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return fmt.Errorf("jetstream: %w", err)
		}
		return c.RunNATS(ctx, js)
	case "kafka":
		cfg, err := outboxkafka.ParseURL(destinationURL)
		if err != nil {
			return err
		}
		if cfg.Topic == "" {
			cfg.Topic = outboxkafka.TopicDefault
		}
		topic, err := outboxkafka.Topic(cfg.Topic, orderevents.AggregateType)
		if err != nil {
			return err
		}
		// SASL and TLS as the URL says, like the relay's.
		opts, err := cfg.ConnectOptions()
		if err != nil {
			return err
		}
		return c.RunKafka(ctx, cfg.Brokers, topic, opts...)
	case "amqp", "amqps":
		cfg, err := outboxamqp.ParseURL(destinationURL)
		if err != nil {
			return err
		}
		if cfg.Exchange == "" {
			cfg.Exchange = outboxamqp.ExchangeDefault
		}
		if c.cfg.AMQPTLS == nil {
			// The URL's ca_file, cert_file and key_file, like the relay's.
			if c.cfg.AMQPTLS, err = cfg.TLSClientConfig(); err != nil {
				return err
			}
		}
		return c.RunAMQP(ctx, cfg.URL, cfg.Exchange, cfg.RoutingKey)
	case "http", "https":
		return c.RunWebhook(ctx, destinationURL, outboxwebhook.SecretsFromEnv())
	default:
		return fmt.Errorf("inventory: destination scheme %q not supported (use %s)", scheme, Schemes)
	}
}
