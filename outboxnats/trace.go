package outboxnats

import "github.com/pgoutbox/outbox"

var _ outbox.MessagingDescriber = (*Publisher)(nil)

// MessagingSystem returns "nats", the relay's messaging.system span
// attribute for this destination.
func (p *Publisher) MessagingSystem() string { return "nats" }

// MessagingDestination returns the subject msg is published on.
func (p *Publisher) MessagingDestination(msg *outbox.Message) string {
	return Subject(p.cfg.SubjectPrefix, msg.AggregateType, msg.AggregateID)
}
