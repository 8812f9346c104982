package outboxwebhook

import "github.com/pgoutbox/outbox"

var _ outbox.MessagingDescriber = (*Publisher)(nil)

// MessagingSystem returns "webhook", the relay's messaging.system span
// attribute for this destination.
func (p *Publisher) MessagingSystem() string { return "webhook" }

// MessagingDestination returns "": the endpoint's URL may hold a secret,
// and it is not a name consumers subscribe to.
func (p *Publisher) MessagingDestination(*outbox.Message) string { return "" }
