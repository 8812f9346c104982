package natsloop

import (
	"log/slog"
	"time"

	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/outboxnats"
)

// Settings are the settings every example NATS consumer (inventory,
// payments, the order saga) shares; each embeds them in its Config.
type Settings struct {
	// Schema holds the outbox and inbox tables. Defaults to "outbox".
	Schema string
	// Stream and SubjectPrefix locate the events in NATS JetStream.
	// Default to outboxnats.StreamDefault and
	// outboxnats.SubjectPrefixDefault.
	Stream, SubjectPrefix string
	// Durable is the JetStream durable consumer (or its name prefix),
	// InboxConsumer the inbox's consumer name. Default to the consumer's
	// DurableDefault and InboxConsumerDefault.
	Durable, InboxConsumer string
	// Workers is how many deliveries are handled at once. Defaults to the
	// consumer's WorkersDefault.
	Workers int
	// AckWait is how long JetStream waits for an ack before redelivering;
	// it also bounds the handling of one delivery. Defaults to the
	// consumer's AckWaitDefault.
	AckWait time.Duration
	// RetryDelay is the first redelivery delay after a failure (or an
	// early event); it grows with each delivery up to the consumer's
	// RetryDelayMax (inbox.Backoff, with jitter). Defaults to the
	// consumer's RetryDelayDefault.
	RetryDelay time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns s with its unset fields set: Schema, Stream,
// SubjectPrefix and Logger to the common defaults, Durable, InboxConsumer,
// Workers, AckWait and RetryDelay to the consumer's own, taken from d. (A
// function, not a method, so that it is no method of the Configs that
// embed Settings.)
func WithDefaults(s, d Settings) Settings {
	if s.Schema == "" {
		s.Schema = pgident.DefaultSchema
	}
	if s.Stream == "" {
		s.Stream = outboxnats.StreamDefault
	}
	if s.SubjectPrefix == "" {
		s.SubjectPrefix = outboxnats.SubjectPrefixDefault
	}
	if s.Durable == "" {
		s.Durable = d.Durable
	}
	if s.InboxConsumer == "" {
		s.InboxConsumer = d.InboxConsumer
	}
	if s.Workers <= 0 {
		s.Workers = d.Workers
	}
	if s.AckWait <= 0 {
		s.AckWait = d.AckWait
	}
	if s.RetryDelay <= 0 {
		s.RetryDelay = d.RetryDelay
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	return s
}
