package outboxkafka

import "github.com/pgoutbox/outbox"

var _ outbox.MessagingDescriber = (*Publisher)(nil)

// MessagingSystem returns "kafka", the relay's messaging.system span
// attribute for this destination.
func (p *Publisher) MessagingSystem() string { return "kafka" }

// MessagingDestination returns the topic msg is produced to ("" when the
// aggregate type makes no valid topic; the publish fails then anyway).
func (p *Publisher) MessagingDestination(msg *outbox.Message) string {
	t, err := Topic(p.cfg.Topic, msg.AggregateType)
	if err != nil {
		return ""
	}
	return t
}
