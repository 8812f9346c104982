package outboxamqp

import "github.com/pgoutbox/outbox"

var _ outbox.MessagingDescriber = (*Publisher)(nil)

// MessagingSystem returns "rabbitmq", the relay's messaging.system span
// attribute for this destination.
func (p *Publisher) MessagingSystem() string { return "rabbitmq" }

// MessagingDestination returns the exchange msg is published to, as the
// OpenTelemetry conventions name a RabbitMQ destination.
func (p *Publisher) MessagingDestination(*outbox.Message) string { return p.cfg.Exchange }
